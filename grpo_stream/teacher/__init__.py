"""The teacher of on-policy distillation: engines that score completion tokens (`engines`)."""
