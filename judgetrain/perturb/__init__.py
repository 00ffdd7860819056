"""`judgetrain perturb`: the data factory. Source samples and a perturbation spec in, the perturbed items a
debiasing panel judges out, in exactly the schema `judgetrain judge` reads.

- `spec`: the YAML spec (operators, sets at rates, the judge prompt template), checked key by key; the packs shipped
  in ``packs/`` (materials, style).
- `source`: source samples read and checked (file, row and field named) before any model loads.
- `operators`: rule operators (table substitutions, numeric perturbations, format rewrites), rates, seeded edits.
- `rewrite`: model rewrites on the engine of `judgetrain judge` (batched, sharded, resumable).
- `build`: every sample x set x rate made, checked, written: items, rejects with reasons, the summary per set.

This stage sits above `judgetrain.judge` (its model rewrites run on the judge engine) and below the commands.
"""
