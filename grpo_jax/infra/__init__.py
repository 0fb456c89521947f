"""Run infrastructure, under everything else: registries (`registry`), ConfigDict <-> dataclass
(`config_lib`), checkpoints, several hosts (`distributed`), logs, metric definitions
(`metrics`), W&B and MLflow (`trackers`), FLOP counts and collapse detection.
"""
