"""What TensorBoard itself reads from an event directory (its own loader, purges applied)."""

import pathlib

from tensorboard.backend.event_processing import event_accumulator


def scalars(logdir: pathlib.Path) -> dict[tuple[int, str], float]:
  """{(step, tag): value} of every scalar TensorBoard shows for `logdir`."""
  acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
  acc.Reload()
  return {(s.step, tag): s.value for tag in acc.Tags()["scalars"] for s in acc.Scalars(tag)}
