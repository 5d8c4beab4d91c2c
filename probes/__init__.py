"""The paper's probes: think-segment entropy with/without images, step-k removal replays, grounding."""
