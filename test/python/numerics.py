"""How bmt's tests compare numbers: the one policy, written down once.
docs/runtime/numerics.md says the same for users.

Two kinds of comparison, and nothing else:

1. Bit equality (`assert_identical`), only where bmt guarantees it: the
   same machine, build, thread count and world size doing the same work
   twice, or two code paths that bmt documents as running the same kernels
   on the same values (the optimizer offloaded or not on the CPU; a skipped
   fp16 step leaving the weights as they were).

2. Closeness to an independent reference (eager PyTorch on the same weights
   and batches; one process against N ranks), relative to the dtype's
   machine epsilon and to the magnitude of the values compared:

       max |got - want| <= ulps * eps(dtype) * max(max |want|, floor)

   Why this form. bmt executes the program's ATen operators, the ones eager
   PyTorch runs, so a difference can only come from re-association: a sum
   blocked another way (another rank count splitting a batch, a kernel
   chosen for another layout). A sum of K terms re-associated moves by at
   most K * eps * sum |terms| and typically by sqrt(K) * eps * max |term|,
   which is below eps * max |want| times a few tens for the test models
   (K <= 512). Which kernels run depends on the CPU (AVX2 or AVX512, MKL's
   code path), but both sides run on the same CPU, so the policy holds on
   every machine; scripts/test.sh runs these tests under a second set of
   kernels to show it. Every bug the tests exist for (a lost mask, a stale
   shard, a missing bias, a wrong scale) is a thousand times larger.

   Gradients are compared norm-wise: `floor` is the largest gradient of the
   model, because a gradient that cancels to nearly zero (a key projection's
   bias: softmax ignores a constant added to a row) still carries the
   rounding of the large terms that cancelled.

Trained parameters are a case of their own (`assert_trained_close`): AdamW
divides the first moment by the root of the second, so the update of an
element is scale-free (|m / sqrt(v)| <= ~1): where two runs' gradients differ
only by rounding, an element whose gradient is itself rounding noise can
move differently by up to 2 lr a step, while every other element agrees to
the rounding of its gradient.
"""
import torch

# Forward values and gradients against eager PyTorch (fp32): 64 ulps of the
# largest value compared (7.6e-6 for values of magnitude 1). Measured: 0 to
# 2 ulps on the fixture models (the same kernels). For scale: MiniLM's
# hidden states computed by another attention algorithm (eager attention
# against SDPA) were 6 ulps off on an AMD AVX2 CPU, 35 (50 with ATen's AVX2
# kernels) on an Intel AVX512 one; with the same algorithm, 0 on both.
PARITY_ULPS = 64
# A loss (a mean over the batch, in float32) against the reference, also
# across world sizes, where the per-rank partial sums are added in another
# order: 32 ulps of the loss (1.9e-5 at a loss of 5).
LOSS_ULPS = 32
# Parameters after a few AdamW steps (assert_trained_close): the mean
# difference over every element within 64 ulps of the mean magnitude
# (1.5e-7 for the fixtures' ~0.02). Measured against torch.optim.AdamW
# (2026-12-01): 1e-10 to 2e-9 after 5 steps in one process, up to 1.1e-8
# after 20 steps on 1 to 4 ranks; a lost weight decay moves the mean by
# lr * wd * mean|p| a step (1e-6 over 5 steps of the fixtures' runs).
TRAINED_MEAN_ULPS = 64
# The optimizers (test_optimizers.py: 5 steps of SGD, Adam, AdamW, Lion,
# Adafactor on tiny GPT-2, 1 and 3 ranks) against torch.optim: every loss
# within 1e-5 absolute (about 15 ulps of the fixture's losses of ~5.5,
# under LOSS_ULPS: the parameters that give it are as close as below) and
# every final parameter element within 1e-4 absolute. The parameters
# differ by the rounding of the gradients (other kernels, other sums over
# ranks), carried through the updates: an Adam-type update divides by
# sqrt(v) + eps, so it turns a gradient's relative rounding into at most
# lr times it; Adafactor's factored v (a product of sums over rows and
# columns added in another order across shards) and SGD's lr * g the
# same. Lion's sign(c) is the sensitive one: an element whose c lies within
# rounding of 0 may take the other sign and move 2 * lr; its test uses lr
# 1e-4 (one flip within 2e-4 would fail the bound: measured, none does).
# Measured (2026-12-01, both sets of CPU kernels): largest parameter
# difference 4e-9 (SGD), 3e-6 (Adam, 3 ranks), 5e-7 (AdamW), 0 (Lion, the
# attention key biases left out: their exact gradient is 0, see the test),
# 2e-7 (Adafactor, 1 and 3 ranks); the weights moved by 3e-4 to 4e-2.
OPTIMIZER_LOSS_TOL = 1e-5
OPTIMIZER_PARAM_TOL = 1e-4


def eps(dtype):
    return torch.finfo(dtype).eps


def tolerance(want, ulps, floor=0.0, dtype=None):
    """The absolute tolerance `ulps * eps * max(max|want|, floor)` for a
    tensor or float `want` (dtype: want's, or float32 for a Python float)."""
    if isinstance(want, torch.Tensor):
        dtype = dtype or want.dtype
        scale = want.detach().abs().max().item() if want.numel() else 0.0
    else:
        dtype = dtype or torch.float32
        scale = abs(want)
    return ulps * eps(dtype) * max(scale, floor)


def max_diff(got, want):
    return (got.detach().double() - want.detach().double()).abs().max().item()


def assert_close(got, want, ulps=PARITY_ULPS, floor=0.0, what="value"):
    """got and want (tensors of one shape, or floats) agree within `ulps` of
    max(max|want|, floor) in want's dtype; the message gives the difference
    in ulps."""
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        diff = max_diff(got, want)
    else:
        diff = abs(float(got) - float(want))
    tol = tolerance(want, ulps, floor)
    assert diff <= tol, f"{what}: max |got - want| = {diff:.3g} > {tol:.3g} ({ulps} ulps)"
    return diff


def assert_loss_close(got, want, what="loss"):
    return assert_close(got, want, LOSS_ULPS, what=what)


def assert_gradients_close(got, want, ulps=PARITY_ULPS):
    """Every parameter's gradient (dicts name -> tensor, the same names)
    within `ulps` of the largest gradient of the model (norm-wise)."""
    assert set(got) == set(want), set(got) ^ set(want)
    floor = max(g.detach().abs().max().item() for g in want.values())
    for name in want:
        assert_close(got[name], want[name], ulps, floor=floor, what=f"gradient of {name}")


def assert_trained_close(got, want, lr_sum, mean_tol=None, differing_fraction=1.0):
    """Parameters after training (dicts name -> tensor) against a reference
    trained with the same update rule. Bounds: every element within 2 *
    lr_sum (the sum of the learning rates of the steps: AdamW cannot put two
    runs further apart); the mean difference within `mean_tol` (default:
    TRAINED_MEAN_ULPS of the mean magnitude, in want's dtype); at most
    `differing_fraction` of the elements differ at all. Returns (max, mean,
    fraction) for the test's message."""
    assert set(want) <= set(got), set(want) - set(got)
    diff = torch.cat([(got[n].double() - p.detach().double()).abs().flatten()
                      for n, p in want.items()])
    if mean_tol is None:
        dtype = next(iter(want.values())).dtype
        magnitude = torch.cat([p.detach().double().abs().flatten() for p in want.values()]).mean()
        mean_tol = TRAINED_MEAN_ULPS * eps(dtype) * magnitude.item()
    stats = (diff.max().item(), diff.mean().item(), (diff > 0).double().mean().item())
    assert stats[0] <= 2 * lr_sum, f"max parameter difference {stats[0]:.3g} > 2 * sum(lr)"
    assert stats[1] <= mean_tol, f"mean parameter difference {stats[1]:.3g} > {mean_tol:.3g}"
    assert stats[2] <= differing_fraction, \
        f"{stats[2]:.1%} of the parameters differ (at most {differing_fraction:.0%})"
    return stats


def assert_identical(got, want, what="tensors"):
    """Bit equality, for what bmt guarantees bit for bit (module docstring)."""
    if isinstance(want, dict):
        assert set(got) == set(want), set(got) ^ set(want)
        for name in want:
            assert_identical(got[name], want[name], f"{what}[{name}]")
        return
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got, want), f"{what}: not bit-identical (max |diff| {max_diff(got, want):.3g})"
