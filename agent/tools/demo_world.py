"""The shipped offline demo world: MAR-style questions about code-drawn images, and a small web.

    python -m agent.tools.demo_world OUT_DIR       # writes OUT_DIR/world/ and OUT_DIR/demo/

Every entity is fictional. Each question is answerable the way the paper's agents work: lens_search
on the query image finds the entity's page, search finds the fact page, visit reads the answer.
Layout written: ``world/pages.jsonl`` (url, title, text, images), ``world/images/*.png`` (images that
appear on pages: the query images themselves and re-encoded copies), and the unified benchmark
``demo/data_unified.jsonl`` with ``demo/imgs/``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from PIL import Image, ImageDraw

from ..cli import done, make_parser

__all__ = ["build_demo_world", "ensure_demo_world", "default_demo_dir", "QUESTIONS"]

WORLD_VERSION = "demo-world-v1"


def _draw(name: str):
    W, H = 160, 120
    im = Image.new("RGB", (W, H), (245, 245, 240))
    d = ImageDraw.Draw(im)
    if name == "kestrel_logo":
        d.ellipse([40, 20, 120, 100], fill=(20, 60, 160))
        d.polygon([(80, 35), (62, 80), (98, 80)], fill=(255, 255, 255))
        d.text((64, 100), "KO", fill=(20, 60, 160))
    elif name == "valdoria_flag":
        for i, c in enumerate([(20, 130, 60), (250, 250, 250), (240, 120, 20)]):
            d.rectangle([i * W // 3, 0, (i + 1) * W // 3, H], fill=c)
        d.regular_polygon((W // 2, H // 2, 18), 5, fill=(200, 20, 20))
    elif name == "tessan_painting":
        im.paste((120, 170, 230), [0, 0, W, H])
        d.ellipse([100, 15, 140, 55], fill=(230, 60, 30))
        d.polygon([(0, H), (50, 40), (95, H)], fill=(70, 80, 90))
        d.polygon([(60, H), (115, 55), (W, H)], fill=(100, 105, 110))
    elif name == "harlow_tower":
        d.rectangle([65, 20, 95, 115], fill=(150, 110, 80))
        d.polygon([(60, 22), (80, 2), (100, 22)], fill=(90, 60, 40))
        d.ellipse([70, 30, 90, 50], fill=(250, 250, 230), outline=(0, 0, 0))
    elif name == "orchard_cover":
        im.paste((40, 90, 60), [0, 0, W, H])
        d.text((20, 20), "THE SILENT", fill=(250, 240, 200))
        d.text((20, 36), "ORCHARD", fill=(250, 240, 200))
        d.ellipse([60, 60, 100, 100], fill=(200, 40, 40))
        d.text((20, 104), "M. ALDEN", fill=(250, 240, 200))
    elif name == "rivermoor_crest":
        d.polygon([(80, 10), (130, 30), (120, 90), (80, 112), (40, 90), (30, 30)], fill=(120, 20, 40))
        d.line([(45, 60), (115, 60)], fill=(255, 215, 0), width=6)
    elif name == "rivermoor_stadium":
        im.paste((90, 150, 90), [0, 60, W, H])
        d.arc([10, 30, 150, 110], 180, 360, fill=(60, 60, 60), width=8)
        d.rectangle([10, 68, 150, 74], fill=(120, 20, 40))
    else:
        raise KeyError(name)
    return im


# (id, query, images, answer, category) — MAR-style, each needing lens -> search -> visit.
QUESTIONS = [
    ("demo_1", "In which year was the observatory whose logo is shown in the image founded?", ["kestrel_logo"], "1911", "Atomic factuality"),
    ("demo_2", "What is the capital city of the country whose flag is shown in the image?", ["valdoria_flag"], "Marsel", "Atomic factuality"),
    ("demo_3", "Who painted the artwork in the image, and in which museum does it hang?", ["tessan_painting"], "Ilse Morrow; Aldgate Museum of Art", "Dynamic information-seeking"),
    ("demo_4", "How tall, in metres, is the tower shown in the picture?", ["harlow_tower"], "87", "Dynamic information-seeking"),
    ("demo_5", "Which publisher released the book shown in the image?", ["orchard_cover"], "Greywater Press", "Visual deep research"),
    ("demo_6", "In which year did the club whose crest is in the first image move into the stadium in the second image?",
     ["rivermoor_crest", "rivermoor_stadium"], "1998", "Visual deep research"),
]

# Pages: (url, title, text, images drawn on the page)
PAGES = [
    ("https://kestrel-observatory.example.org/", "Kestrel Observatory — official site",
     "Welcome to Kestrel Observatory, a public astronomical observatory on Fenwick Ridge. Visit our history page for the story of our founding.", ["kestrel_logo"]),
    ("https://wiki.example.org/Kestrel_Observatory", "Kestrel Observatory - Encyclopedia",
     "Kestrel Observatory is an astronomical observatory on Fenwick Ridge. It was founded in 1911 by the astronomer Clara Fenwick. Its main telescope is a 1.2 m reflector.", []),
    ("https://news.example.org/kestrel-telescope-upgrade", "Kestrel telescope upgrade completed",
     "The observatory on Fenwick Ridge finished upgrading its reflector this spring.", []),
    ("https://wiki.example.org/Kestrel_(bird)", "Kestrel (bird) - Encyclopedia",
     "The kestrel is a small falcon. Kestrels hover while hunting.", []),
    ("https://flags.example.org/valdoria", "Flag of Valdoria",
     "The flag of the Republic of Valdoria: green, white and orange vertical stripes with a red star.", ["valdoria_flag"]),
    ("https://wiki.example.org/Valdoria", "Valdoria - Encyclopedia",
     "Valdoria, officially the Republic of Valdoria, is a small coastal country. Its capital and largest city is Marsel. The currency is the valdor.", []),
    ("https://travel.example.org/marsel-guide", "Marsel travel guide",
     "Marsel, the capital of Valdoria, is known for its harbour and old town.", []),
    ("https://flags.example.org/tricolours", "Tricolour flags of the world",
     "Many countries use vertical tricolours; green-white-orange designs appear in several flags.", []),
    ("https://art.example.org/dawn-over-tessan-peaks", "Dawn over Tessan Peaks",
     "Dawn over Tessan Peaks, oil on canvas, shows a red sun rising over two grey mountains.", ["tessan_painting"]),
    ("https://wiki.example.org/Dawn_over_Tessan_Peaks", "Dawn over Tessan Peaks - Encyclopedia",
     "Dawn over Tessan Peaks is a 1923 painting by the painter Ilse Morrow. It hangs in the Aldgate Museum of Art.", []),
    ("https://wiki.example.org/Ilse_Morrow", "Ilse Morrow - Encyclopedia",
     "Ilse Morrow (1890-1961) was a landscape painter known for mountain scenes such as Dawn over Tessan Peaks.", []),
    ("https://museum.example.org/aldgate-collection", "Aldgate Museum of Art — collection",
     "Highlights of the Aldgate Museum of Art include landscape paintings of the 1920s.", []),
    ("https://towers.example.org/harlow-clock-tower", "Harlow Clock Tower",
     "The Harlow Clock Tower is a brick clock tower in the town square of Harlow Bridge.", ["harlow_tower"]),
    ("https://wiki.example.org/Harlow_Clock_Tower", "Harlow Clock Tower - Encyclopedia",
     "The Harlow Clock Tower in Harlow Bridge was completed in 1887. The tower is 87 metres tall, with a clock face on each side.", []),
    ("https://wiki.example.org/Harlow_Bridge", "Harlow Bridge - Encyclopedia",
     "Harlow Bridge is a market town whose square is dominated by a brick clock tower.", []),
    ("https://towers.example.org/tallest-clock-towers", "Tallest clock towers",
     "A list of tall clock towers; heights range from 40 to 120 metres.", []),
    ("https://books.example.org/the-silent-orchard", "The Silent Orchard by M. Alden",
     "The Silent Orchard is a novel by M. Alden with a green cover and a red apple.", ["orchard_cover"]),
    ("https://wiki.example.org/The_Silent_Orchard", "The Silent Orchard - Encyclopedia",
     "The Silent Orchard is a 2019 novel by M. Alden. It was published by Greywater Press and won the Linden Prize.", []),
    ("https://wiki.example.org/Greywater_Press", "Greywater Press - Encyclopedia",
     "Greywater Press is an independent publisher founded in 1978.", []),
    ("https://reviews.example.org/silent-orchard-review", "Review: The Silent Orchard",
     "A quiet novel about an orchard and a family; Alden's best book so far.", []),
    ("https://rivermoor-fc.example.org/", "Rivermoor FC — official site",
     "Rivermoor FC, the crimson club with the golden bar on its crest. Home games at Moorside Park.", ["rivermoor_crest"]),
    ("https://stadiums.example.org/moorside-park", "Moorside Park stadium",
     "Moorside Park is a football stadium with a curved roof and crimson trim.", ["rivermoor_stadium"]),
    ("https://wiki.example.org/Rivermoor_FC", "Rivermoor FC - Encyclopedia",
     "Rivermoor FC is a football club founded in 1902. The club moved into Moorside Park in 1998, leaving its old ground at Mill Lane.", []),
    ("https://wiki.example.org/Moorside_Park", "Moorside Park - Encyclopedia",
     "Moorside Park opened in 1997 and has been the home of Rivermoor FC since 1998.", []),
    ("https://news.example.org/football-grounds", "Football grounds that changed homes",
     "Several clubs moved to new stadiums in the late 1990s.", []),
    ("https://blocked.example.org/archive", "Archive",
     "Just a moment... Verify you are human by completing the action below.", []),
]


def default_demo_dir() -> Path:
    env = os.environ.get("MMCF_DEMO_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mmcf-toolkit" / "demo-data"


def build_demo_world(out_dir: str | os.PathLike) -> Path:
    """Write the world and the demo benchmark under ``out_dir`` (deterministic)."""
    out = Path(out_dir)
    (out / "world" / "images").mkdir(parents=True, exist_ok=True)
    (out / "demo" / "imgs").mkdir(parents=True, exist_ok=True)
    names = sorted({n for q in QUESTIONS for n in q[2]})
    for n in names:
        im = _draw(n)
        im.save(out / "demo" / "imgs" / f"{n}.png", optimize=False)
        im.save(out / "world" / "images" / f"{n}.png", optimize=False)
        # a re-encoded, resized copy, as the web would have it (lens must still find it)
        im.resize((im.width * 2, im.height * 2)).save(out / "world" / "images" / f"{n}_web.jpg", quality=85)
    with open(out / "world" / "pages.jsonl", "w") as f:
        for url, title, text, imgs in PAGES:
            files = [f"{n}_web.jpg" for n in imgs]
            f.write(json.dumps({"url": url, "title": title, "text": text, "images": files}) + "\n")
    with open(out / "demo" / "data_unified.jsonl", "w") as f:
        for qid, query, imgs, answer, cat in QUESTIONS:
            f.write(json.dumps({"id": qid, "query": query, "query_images": [f"{n}.png" for n in imgs], "answer": answer,
                                "source": "demo", "category": cat}) + "\n")
    (out / "VERSION").write_text(WORLD_VERSION)
    return out


def ensure_demo_world(out_dir: str | os.PathLike | None = None) -> Path:
    p = Path(out_dir) if out_dir else default_demo_dir()
    try:
        if (p / "VERSION").read_text() == WORLD_VERSION:
            return p
    except OSError:
        pass
    return build_demo_world(p)


def main(argv=None) -> int:
    ap = make_parser("python -m agent.tools.demo_world", "Write the shipped offline demo world and the 'demo' benchmark.",
                     ["python -m agent.tools.demo_world /tmp/demo-world", "python -m agent.tools.demo_world"])
    ap.add_argument("out_dir", nargs="?", help="where to write world/ and demo/ (default: the cache directory)")
    a = ap.parse_args(argv)
    out = build_demo_world(a.out_dir or default_demo_dir())
    done([f"{out}/world (pages.jsonl, images/)", f"{out}/demo (data_unified.jsonl, imgs/)"],
         f"python -m agent.run --method react --benchmark {out}/demo --world {out}/world --out runs/demo")
    return 0


if __name__ == "__main__":
    sys.exit(main())
