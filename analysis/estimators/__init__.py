"""The estimators: the numbers the paper's analyses compute, below everything else (numpy, scipy, pandas and the
record's models only; no run directory, backend or figure).

- ``entropy``: B.4's grouped-tail entropy of a top-k record (a reference function read like the paper beside the
  fast kernel, tested equal), its bounds over the vocabulary, the think segment's entropy, the forking tokens and
  every aggregation of a step's per-token entropies;
- ``influence``: the images' KL influence on each token of a step (ours: the teacher-forced probe and the adaptive
  image unloading);
- ``stats``: bootstrap intervals, Wilcoxon and McNemar tests, AUROC;
- ``selection``: which trajectories enter the probes' analyses (B.1, Table 10).
"""
