"""Context parallelism in the trainer (`trainer.context_parallel = N`): one long sequence
split over N ranks, attention exact.

Ulysses (DeepSpeed-Ulysses, arXiv 2309.14509), not ring attention: each rank holds 1/N of
every row's columns, and each attention layer trades columns for heads with an all-to-all,
attends over the whole row for H/N heads, and trades back (`attention`). Why Ulysses here:

- it runs the attention kernel torch already has (scaled_dot_product_attention, causal
  within each packed sequence, flash or memory-efficient where the device has one) over
  whole rows, so packed rows, prompt rows' 4D masks and every model behind transformers'
  attention interface work unchanged, and the numbers are those of one process up to float
  rounding; ring attention needs a kernel that returns the softmax's log-sum-exp and a
  backward of its own, and causal load balancing (zig-zag column orders);
- its traffic per rank is O(W * hidden / N) per layer whatever N, against ring attention's
  O(W * hidden) passes of keys and values;
- its limit, N at most the attention heads and dividing them (refused in one line by
  `config.trainer.check_context_heads`, in pre-flight and at start), suits the degrees a
  trainer uses (2 to 8; GQA keys and values are repeated when N does not divide their heads).

The pieces: `groups` (which ranks split a sequence; the leader's batch shared with the
group), `attention` (the all-to-all attention), `forward` (a micro-batch's log-probs from
this rank's columns, gathered over the group). The trainer's side is in
training/state.py: the group is made at start, every forward of the policy and reference
goes through `forward`, the backward is scaled by N (DDP and FSDP2 average the gradients
of all ranks, the N partial gradients of a group must add up) and the loss normalisers
count the data-parallel ranks only.
"""
