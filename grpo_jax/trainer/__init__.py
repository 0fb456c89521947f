"""The trainer: one module per step of the data path, on top of the library folders.

`build` (a ConfigDict -> the run's `Setup`, every check before anything compiles), `steps`
(every `jax.jit` with its shardings, and the memory check: `memory`, `memory_advice`),
`rollout` and `pipeline` (one iteration's prompts, samples and scores; the off-policy
pipeline), `warmstart`, `heldout`, `run_state` and `train` (the loop: `train.run`); the
ahead-of-time compile (`aot`, `abstract`), `grpo-jax eval` (`eval_command`,
`eval_figures`) and `grpo-jax rm-train` (`rm_train`). The config edge (`grpo_jax.config`,
`grpo_jax.schema`) and the command line (`grpo_jax.main`, `cli`, `commands`, `demo`)
stay at the package root.
"""
