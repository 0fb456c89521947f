"""Generation beyond one sampler call: counterfactual rows (`counterfactuals`: branches
from prefixes, samples under perturbed prompts, merged with their provenance), DAPO's
dynamic sampling (`dynamic_sampling`) and partial rollouts decoded a segment at a time
(`partial`). Below them, `models.sampling` (and `models.paged`, `models.refill`) decode;
above them, the trainer's `rollout` drives one iteration's generation. The objective's
side of these rows (which plans IBPO may read, their weights) is in `rl/`.
"""
