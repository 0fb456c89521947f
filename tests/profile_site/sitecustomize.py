"""On a child's path only under GRPO_JAX_COMPILE_PROFILE (`subproc.child_env`)."""

import compile_profile

compile_profile.install_in_child()
