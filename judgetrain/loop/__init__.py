"""`judgetrain loop`: rounds of the debiasing loop (items -> the current judge's evaluations -> pairs -> DPO from the
last round's adapter -> evaluation against the base), each stage the command a user runs, resumable, and the round
table of every figure against the base."""
