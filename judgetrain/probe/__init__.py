"""`judgetrain probe`: what a base judge can see before any training.

For a model and the items `judgetrain perturb` made from source samples, three comparisons of one source's texts:

- ``error``: the source against each error copy (the share where the source wins);
- ``represent``: the source against each representational copy (the share where the source is scored higher: the
  base sees change, where an invariant judge would sit at one half);
- ``cross``: a representational copy against an error copy of the same source (the share where the rewrite wins:
  whether the base tells an error from a change of form).

Each is read zero-shot in every scoring mode (`readings`: the log-likelihood of the text after its question, per token
and summed; judge mode's expected score; the verdict in both orders) and by a linear probe of the frozen model's hidden
states (`hidden`, `linear`: fitted on some error types and scored on one it never saw, and on held-out samples), every
figure with a 95% interval over source samples (`figures`). `pairs` reads and pairs the texts before any model loads;
`run` ties the stages together.
"""

MODES = ("implicit", "judge", "verdict")  # the zero-shot scoring modes a probe reads (`readings`)
