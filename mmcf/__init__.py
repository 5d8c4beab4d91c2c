"""``mmcf``: the toolkit's one front door. Each subcommand is the program its ``python -m`` form runs.

    mmcf --help                   # every command, one line each
    mmcf run --method react ...   # = python -m agent.run --method react ...
"""
