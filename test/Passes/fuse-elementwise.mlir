// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise=inline-calls=true 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise=inline-calls=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// Without inline-calls the activation stays a call (the last case).
// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise 2>/dev/null | FileCheck %s --check-prefix=NOINLINE
// The fused IR parses back and verifies.
// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise 2>/dev/null | bmt-opt --split-input-file -o /dev/null
// With second-results: values read after a region's root are its further
// results, and norm submodules are inlined (the SECOND cases).
// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise='inline-calls=true second-results=true' 2>/dev/null | FileCheck %s --check-prefix=SECOND
// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise='inline-calls=true second-results=true' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SECOND-REMARK
// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise='inline-calls=true second-results=true' 2>/dev/null | bmt-opt --split-input-file -o /dev/null

// RMSNorm as LLaMA's trace writes it: the input's fp32 cast is also returned
// (the residual), so it stays outside and is the region's first input; the
// rest, up to the weight multiply, is one "row" region.
// CHECK-LABEL: func.func private @rms_norm(
// CHECK:         %[[W:.*]] = bmt.get_global @w
// CHECK-NEXT:    %[[X:.*]] = bmt.aten "aten::to.dtype"(%arg0, 6, false, false, #bmt.none)
// CHECK-NEXT:    %[[Y:.*]] = bmt.fused "row"(%[[X]], %[[W]]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor {
// CHECK-NEXT:    ^bb0(%[[A:.*]]: !bmt.tensor, %[[B:.*]]: !bmt.tensor):
// CHECK-NEXT:      %[[P:.*]] = bmt.aten "aten::pow.Tensor_Scalar"(%[[A]], 2)
// CHECK-NEXT:      %[[M:.*]] = bmt.aten "aten::mean.dim"(%[[P]], [-1], true, #bmt.none)
// CHECK-NEXT:      %[[E:.*]] = bmt.constant dense<9.9999999999999995E-7> : tensor<f64>
// CHECK-NEXT:      %[[S:.*]] = bmt.aten "aten::add.Tensor"(%[[M]], %[[E]], 1)
// CHECK-NEXT:      %[[R:.*]] = bmt.aten "aten::rsqrt"(%[[S]])
// CHECK-NEXT:      %[[N:.*]] = bmt.aten "aten::mul.Tensor"(%[[A]], %[[R]])
// CHECK-NEXT:      %[[C:.*]] = bmt.aten "aten::to.dtype"(%[[N]], 15, false, false, #bmt.none)
// CHECK-NEXT:      %[[O:.*]] = bmt.aten "aten::mul.Tensor"(%[[B]], %[[C]])
// CHECK-NEXT:      bmt.yield %[[O]] : !bmt.tensor
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[Y]], %[[X]]
// REMARK: remark: bmt-fuse-elementwise: 7 ops in 1 region (1 with a last-dim reduction) in 1 function (rms_norm)
// With second-results the cast, returned after the norm, joins as the
// region's second result.
// SECOND-LABEL: func.func private @rms_norm(
// SECOND:         %[[Y:.*]]:2 = bmt.fused "row"(%arg0, %{{.*}}) : (!bmt.tensor, !bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
// SECOND-NEXT:    ^bb0(%[[IN:.*]]: !bmt.tensor,
// SECOND-NEXT:      %[[A:.*]] = bmt.aten "aten::to.dtype"(%[[IN]], 6, false, false, #bmt.none)
// SECOND:           bmt.yield %{{.*}}, %[[A]] : !bmt.tensor, !bmt.tensor
// SECOND-NEXT:    }
// SECOND-NEXT:    return %[[Y]]#0, %[[Y]]#1
// SECOND-REMARK: remark: bmt-fuse-elementwise: 8 ops in 1 region (1 with a last-dim reduction, 1 with a second result) in 1 function (rms_norm)
module {
  bmt.parameter @w : tensor<8xf32> {requires_grad}
  func.func private @rms_norm(%arg0: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
    %0 = bmt.get_global @w : !bmt.tensor
    %1 = bmt.aten "aten::to.dtype"(%arg0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %2 = bmt.aten "aten::pow.Tensor_Scalar"(%1, 2) : (!bmt.tensor) -> !bmt.tensor
    %3 = bmt.aten "aten::mean.dim"(%2, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %4 = bmt.constant dense<9.9999999999999995E-7> : tensor<f64>
    %5 = bmt.aten "aten::add.Tensor"(%3, %4, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::rsqrt"(%5) : (!bmt.tensor) -> !bmt.tensor
    %7 = bmt.aten "aten::mul.Tensor"(%1, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %8 = bmt.aten "aten::to.dtype"(%7, 15, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %9 = bmt.aten "aten::mul.Tensor"(%0, %8) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %9, %1 : !bmt.tensor, !bmt.tensor
  }
}

// -----

// SwiGLU with a residual add and scalar arguments in place: one "pointwise"
// region of three inputs; the dead outer constant goes.
// CHECK-LABEL: func.func private @swiglu(
// CHECK-NEXT:    %[[Y:.*]] = bmt.fused "pointwise"(%arg0, %arg1, %arg2)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      bmt.aten "aten::silu"
// CHECK-NEXT:      bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:      bmt.constant dense<5.000000e-01>
// CHECK-NEXT:      bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:      bmt.aten "aten::add.Tensor"
// CHECK-NEXT:      bmt.aten "aten::sub.Scalar"({{.*}}, 1.000000e+00, 2)
// CHECK-NEXT:      bmt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[Y]]
// REMARK: remark: bmt-fuse-elementwise: 5 ops in 1 region (0 with a last-dim reduction) in 1 function (swiglu)
module {
  func.func private @swiglu(%g: !bmt.tensor, %u: !bmt.tensor, %r: !bmt.tensor) -> !bmt.tensor {
    %h = bmt.constant dense<5.000000e-01> : tensor<f64>
    %0 = bmt.aten "aten::silu"(%g) : (!bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::mul.Tensor"(%0, %u) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %2 = bmt.aten "aten::mul.Tensor"(%1, %h) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %3 = bmt.aten "aten::add.Tensor"(%2, %r, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %4 = bmt.aten "aten::sub.Scalar"(%3, 1.0, 2) : (!bmt.tensor) -> !bmt.tensor
    return %4 : !bmt.tensor
  }
}

// -----

// Negative cases. An in-place op is never fused and stops the region; so does
// a view. An op whose value is also used outside (%1, returned) is an input.
// CHECK-LABEL: func.func private @stops(
// CHECK-NEXT:    %[[A:.*]] = bmt.aten "aten::exp"(%arg0)
// CHECK-NEXT:    %[[B:.*]] = bmt.aten "aten::add_.Tensor"(%[[A]], %arg1, 1)
// CHECK-NEXT:    %[[C:.*]] = bmt.aten "aten::neg"(%[[B]])
// CHECK-NEXT:    %[[V:.*]] = bmt.aten "aten::view"(%[[C]], [-1])
// CHECK-NEXT:    %[[D:.*]] = bmt.fused "pointwise"(%[[V]], %arg1)
// CHECK:           aten::tanh
// CHECK-NEXT:      aten::mul.Tensor
// CHECK-NEXT:      bmt.yield
// CHECK:         %[[E:.*]] = bmt.fused "pointwise"(%[[D]])
// CHECK:           aten::sigmoid
// CHECK-NEXT:      aten::relu
// CHECK:         return %[[E]], %[[D]]
// REMARK: remark: bmt-fuse-elementwise: 4 ops in 2 regions (0 with a last-dim reduction) in 1 function (stops)
// With second-results %5, returned after the root, is a result of one region.
// SECOND-LABEL: func.func private @stops(
// SECOND:         %[[R:.*]]:2 = bmt.fused "pointwise"(%{{.*}}, %arg1) : (!bmt.tensor, !bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
// SECOND:         return %[[R]]#0, %[[R]]#1
// SECOND-REMARK: remark: bmt-fuse-elementwise: 4 ops in 1 region (0 with a last-dim reduction, 1 with a second result) in 1 function (stops)
module {
  func.func private @stops(%x: !bmt.tensor, %y: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
    %0 = bmt.aten "aten::exp"(%x) : (!bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::add_.Tensor"(%0, %y, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %2 = bmt.aten "aten::neg"(%1) : (!bmt.tensor) -> !bmt.tensor
    %3 = bmt.aten "aten::view"(%2, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %4 = bmt.aten "aten::tanh"(%3) : (!bmt.tensor) -> !bmt.tensor
    %5 = bmt.aten "aten::mul.Tensor"(%4, %y) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::sigmoid"(%5) : (!bmt.tensor) -> !bmt.tensor
    %7 = bmt.aten "aten::relu"(%6) : (!bmt.tensor) -> !bmt.tensor
    return %7, %5 : !bmt.tensor, !bmt.tensor
  }
}

// -----

// Reductions: one per region. A mean over another dim, without keepdim, or
// a softmax is not fused; LayerNorm written out has two last-dim means: the
// region takes the variance's and the first mean stays outside as an input.
// A run-time scalar (an f64 operand) is not fused either.
// CHECK-LABEL: func.func private @reductions(
// CHECK-NEXT:    bmt.aten "aten::mean.dim"(%arg0, [1], true, #bmt.none)
// CHECK-NEXT:    bmt.aten "aten::mean.dim"(%arg0, [-1], false, #bmt.none)
// CHECK-NEXT:    bmt.aten "aten::softmax.int"
// CHECK-NEXT:    %[[MU:.*]] = bmt.aten "aten::mean.dim"(%arg0, [-1], true, #bmt.none)
// CHECK-NEXT:    %[[LN:.*]] = bmt.fused "row"(%arg0, %[[MU]], %arg1)
// CHECK:           aten::sub.Tensor
// CHECK-NEXT:      aten::pow.Tensor_Scalar
// CHECK-NEXT:      aten::mean.dim
// CHECK:           aten::rsqrt
// CHECK-NEXT:      aten::mul.Tensor
// CHECK-NEXT:      aten::mul.Tensor
// CHECK-NEXT:      bmt.yield
// CHECK:         bmt.aten "aten::mul.Scalar"(%[[LN]], %arg2)
// CHECK-NOT:     bmt.fused
// REMARK: remark: bmt-fuse-elementwise: 7 ops in 1 region (1 with a last-dim reduction) in 1 function (reductions)
module {
  func.func private @reductions(%x: !bmt.tensor, %w: !bmt.tensor, %s: f64) -> (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) {
    %a = bmt.aten "aten::mean.dim"(%x, [1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %b = bmt.aten "aten::mean.dim"(%x, [-1], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %c = bmt.aten "aten::softmax.int"(%x, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %mu = bmt.aten "aten::mean.dim"(%x, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %d = bmt.aten "aten::sub.Tensor"(%x, %mu, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %d2 = bmt.aten "aten::pow.Tensor_Scalar"(%d, 2) : (!bmt.tensor) -> !bmt.tensor
    %var = bmt.aten "aten::mean.dim"(%d2, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %eps = bmt.constant dense<1.000000e-05> : tensor<f64>
    %ve = bmt.aten "aten::add.Tensor"(%var, %eps, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %r = bmt.aten "aten::rsqrt"(%ve) : (!bmt.tensor) -> !bmt.tensor
    %n = bmt.aten "aten::mul.Tensor"(%d, %r) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %ln = bmt.aten "aten::mul.Tensor"(%n, %w) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %out = bmt.aten "aten::mul.Scalar"(%ln, %s) : (!bmt.tensor, f64) -> !bmt.tensor
    return %a, %b, %c, %out : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
  }
}

// -----

// aten::layer_norm over the last dim is a reduction: BERT's post-norm
// add + layer_norm is one "row" region, and a layer_norm alone is a region
// too (the row kernel replaces ATen's). One over two dims, with a run-time
// eps, or after another reduction in the region is left alone.
// CHECK-LABEL: func.func private @layer_norms(
// CHECK-NEXT:    %[[P:.*]] = bmt.fused "row"(%arg0, %arg1, %arg2, %arg3)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      %[[S:.*]] = bmt.aten "aten::add.Tensor"
// CHECK-NEXT:      bmt.aten "aten::layer_norm"(%[[S]], [8], %{{.*}}, %{{.*}}, 1.000000e-05, true)
// CHECK-NEXT:      bmt.yield
// CHECK:         %[[A:.*]] = bmt.fused "row"(%[[P]])
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      bmt.aten "aten::layer_norm"({{.*}}, [8], #bmt.none, #bmt.none, 1.000000e-05, true)
// CHECK-NEXT:      bmt.yield
// CHECK:         bmt.aten "aten::layer_norm"(%[[A]], [2, 4],
// CHECK-NEXT:    bmt.aten "aten::layer_norm"(%[[A]], [8], #bmt.none, #bmt.none, %arg4, true)
// CHECK-NEXT:    %[[M:.*]] = bmt.aten "aten::mean.dim"(%[[A]], [-1], true, #bmt.none)
// CHECK-NEXT:    bmt.fused "row"(%[[M]])
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      bmt.aten "aten::layer_norm"
// CHECK-NEXT:      bmt.yield
// REMARK: remark: bmt-fuse-elementwise: 4 ops in 3 regions (3 with a last-dim reduction) in 1 function (layer_norms)
module {
  func.func private @layer_norms(%x: !bmt.tensor, %y: !bmt.tensor, %w: !bmt.tensor, %b: !bmt.tensor, %eps: f64) -> (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) {
    %s = bmt.aten "aten::add.Tensor"(%x, %y, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %post = bmt.aten "aten::layer_norm"(%s, [8], %w, %b, 1.000000e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %alone = bmt.aten "aten::layer_norm"(%post, [8], #bmt.none, #bmt.none, 1.000000e-05, true) : (!bmt.tensor) -> !bmt.tensor
    %two = bmt.aten "aten::layer_norm"(%alone, [2, 4], #bmt.none, #bmt.none, 1.000000e-05, true) : (!bmt.tensor) -> !bmt.tensor
    %dyn = bmt.aten "aten::layer_norm"(%alone, [8], #bmt.none, #bmt.none, %eps, true) : (!bmt.tensor, f64) -> !bmt.tensor
    %m = bmt.aten "aten::mean.dim"(%alone, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %after = bmt.aten "aten::layer_norm"(%m, [8], #bmt.none, #bmt.none, 1.000000e-05, true) : (!bmt.tensor) -> !bmt.tensor
    return %two, %dyn, %after, %post : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
  }
}

// -----

// softmax over the last dim ends a "row" region (the attention's scale +
// mask + softmax), or a cast of it does; its dtype argument may be a
// floating dtype. It never joins another consumer (the mul + exp after it
// are a region of their own that reads it), nor over another dim, nor
// alone, nor after another reduction.
// CHECK-LABEL: func.func private @softmaxes(
// CHECK-NEXT:    %[[P:.*]] = bmt.fused "row"(%arg0, %arg1)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      bmt.constant
// CHECK-NEXT:      bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:      bmt.aten "aten::add.Tensor"
// CHECK-NEXT:      bmt.aten "aten::softmax.int"({{.*}}, -1, 6)
// CHECK-NEXT:      bmt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[C:.*]] = bmt.fused "row"(%arg0)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      bmt.aten "aten::softmax.int"({{.*}}, -1, 6)
// CHECK-NEXT:      bmt.aten "aten::to.dtype"({{.*}}, 15,
// CHECK-NEXT:      bmt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[E:.*]] = bmt.fused "pointwise"(%[[P]], %arg1)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:      bmt.aten "aten::exp"
// CHECK-NEXT:      bmt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    bmt.aten "aten::softmax.int"(%[[E]], 1, #bmt.none)
// CHECK-NEXT:    bmt.aten "aten::softmax.int"(%arg0, -1, #bmt.none)
// CHECK-NEXT:    %[[M:.*]] = bmt.aten "aten::mean.dim"(%arg0, [-1], true, #bmt.none)
// CHECK-NEXT:    bmt.fused "row"(%arg0, %[[M]])
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:      bmt.aten "aten::softmax.int"
// CHECK-NEXT:      bmt.yield
// REMARK: remark: bmt-fuse-elementwise: 9 ops in 4 regions (3 with a last-dim reduction) in 1 function (softmaxes)
module {
  func.func private @softmaxes(%x: !bmt.tensor, %mask: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) {
    %c = bmt.constant dense<1.250000e-01> : tensor<f64>
    %s = bmt.aten "aten::mul.Tensor"(%x, %c) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %a = bmt.aten "aten::add.Tensor"(%s, %mask, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %p = bmt.aten "aten::softmax.int"(%a, -1, 6) : (!bmt.tensor) -> !bmt.tensor
    %f = bmt.aten "aten::softmax.int"(%x, -1, 6) : (!bmt.tensor) -> !bmt.tensor
    %cast = bmt.aten "aten::to.dtype"(%f, 15, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %after = bmt.aten "aten::mul.Tensor"(%p, %mask) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %e = bmt.aten "aten::exp"(%after) : (!bmt.tensor) -> !bmt.tensor
    %other = bmt.aten "aten::softmax.int"(%e, 1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %alone = bmt.aten "aten::softmax.int"(%x, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %m = bmt.aten "aten::mean.dim"(%x, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %n = bmt.aten "aten::mul.Tensor"(%x, %m) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %two = bmt.aten "aten::softmax.int"(%n, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %other, %alone, %two, %p, %cast : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
  }
}

// -----

// Nothing to fuse.
// REMARK: remark: bmt-fuse-elementwise: no region of two or more fusible ops
module {
  func.func private @single(%x: !bmt.tensor) -> !bmt.tensor {
    %0 = bmt.aten "aten::exp"(%x) : (!bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
}

// -----

// A parameter-free submodule of fusible ops (an activation) is inlined into
// its caller and joins the caller's region; one that reads a parameter, or
// holds a reduction, is called as before.
// CHECK-LABEL: func.func private @mlp(
// CHECK-NEXT:    %[[N:.*]] = call @norm(%arg0)
// CHECK-NEXT:    %[[Y:.*]] = bmt.fused "pointwise"(%arg0, %arg1, %[[N]])
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      aten::silu
// CHECK-NEXT:      aten::mul.Tensor
// CHECK-NEXT:      aten::add.Tensor
// CHECK-NEXT:      bmt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[Y]]
// CHECK-LABEL: func.func private @act(
// CHECK-NEXT:    aten::silu
// REMARK: remark: bmt-fuse-elementwise: 3 ops in 1 region (0 with a last-dim reduction) in 1 function (mlp); 1 call of fusible submodules inlined
// NOINLINE-LABEL: func.func private @mlp(
// NOINLINE-NEXT:    call @act(%arg0)
// NOINLINE-NEXT:    call @norm(%arg0)
// NOINLINE-NEXT:    bmt.fused "pointwise"
// NOINLINE:           aten::mul.Tensor
// NOINLINE-NEXT:      aten::add.Tensor
// NOINLINE-NEXT:      bmt.yield
module {
  bmt.parameter @scale : tensor<8xf32> {requires_grad}
  func.func private @mlp(%g: !bmt.tensor, %u: !bmt.tensor) -> !bmt.tensor {
    %0 = call @act(%g) : (!bmt.tensor) -> !bmt.tensor
    %n = call @norm(%g) : (!bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::mul.Tensor"(%0, %u) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %2 = bmt.aten "aten::add.Tensor"(%1, %n, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %2 : !bmt.tensor
  }
  func.func private @act(%x: !bmt.tensor) -> !bmt.tensor {
    %0 = bmt.aten "aten::silu"(%x) : (!bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
  func.func private @norm(%x: !bmt.tensor) -> !bmt.tensor {
    %w = bmt.get_global @scale : !bmt.tensor
    %0 = bmt.aten "aten::mul.Tensor"(%x, %w) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
}

// -----

// RoPE with rotate_half as torch.export records it (constant bounds): the
// slices, the neg and the cat join the region whole, q is read whole.
// CHECK-LABEL: func.func private @rope_exported(
// CHECK-NEXT:    %[[Q:.*]] = bmt.aten "aten::transpose.int"(%arg0, 1, 2)
// CHECK-NEXT:    %[[Y:.*]] = bmt.fused "pointwise"(%[[Q]], %arg1, %arg2)
// CHECK-NEXT:    ^bb0(%[[A:.*]]: !bmt.tensor, %[[C:.*]]: !bmt.tensor, %[[S:.*]]: !bmt.tensor):
// CHECK-NEXT:      %[[M1:.*]] = bmt.aten "aten::mul.Tensor"(%[[A]], %[[C]])
// CHECK-NEXT:      %[[X1:.*]] = bmt.aten "aten::slice.Tensor"(%[[A]], 3, 0, 4, 1)
// CHECK-NEXT:      %[[X2:.*]] = bmt.aten "aten::slice.Tensor"(%[[A]], 3, 4, 9223372036854775807, 1)
// CHECK-NEXT:      %[[N:.*]] = bmt.aten "aten::neg"(%[[X2]])
// CHECK-NEXT:      %[[R:.*]] = bmt.aten "aten::cat"([%[[N]], %[[X1]]], -1)
// CHECK-NEXT:      %[[M2:.*]] = bmt.aten "aten::mul.Tensor"(%[[R]], %[[S]])
// CHECK-NEXT:      %[[O:.*]] = bmt.aten "aten::add.Tensor"(%[[M1]], %[[M2]], 1)
// CHECK-NEXT:      bmt.yield %[[O]]
// CHECK:         return %[[Y]]
// REMARK: remark: bmt-fuse-elementwise: 7 ops in 1 region (0 with a last-dim reduction, 1 rotate_half) in 1 function (rope_exported)
module {
  func.func private @rope_exported(%arg0: !bmt.tensor, %arg1: !bmt.tensor, %arg2: !bmt.tensor) -> !bmt.tensor {
    %q = bmt.aten "aten::transpose.int"(%arg0, 1, 2) : (!bmt.tensor) -> !bmt.tensor
    %0 = bmt.aten "aten::mul.Tensor"(%q, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::slice.Tensor"(%q, 3, 0, 4, 1) : (!bmt.tensor) -> !bmt.tensor
    %2 = bmt.aten "aten::slice.Tensor"(%q, 3, 4, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
    %3 = bmt.aten "aten::neg"(%2) : (!bmt.tensor) -> !bmt.tensor
    %4 = bmt.aten "aten::cat"([%3, %1], -1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %5 = bmt.aten "aten::mul.Tensor"(%4, %arg2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::add.Tensor"(%0, %5, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %6 : !bmt.tensor
  }
}

// -----

// What stays out: halves of a value a region computes (the runtime reads
// halves of a region input only), unequal halves, a slice with a step, a
// slice with another reader, halves of two tensors, and rotate_half next
// to a reduction (no row kernel reads halves).
// CHECK-LABEL: func.func private @not_rotate_half(
// CHECK:         %[[V:.*]] = bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:    aten::slice.Tensor"(%[[V]], 3, 0, 4, 1)
// CHECK-NEXT:    aten::slice.Tensor"(%[[V]], 3, 4, 9223372036854775807, 1)
// CHECK-NEXT:    aten::neg
// CHECK-NEXT:    %[[A:.*]] = bmt.aten "aten::cat"
// CHECK:         aten::slice.Tensor"(%arg1, 3, 3, 9223372036854775807, 1)
// CHECK-NEXT:    %[[B:.*]] = bmt.aten "aten::cat"
// CHECK-NEXT:    bmt.fused "pointwise"(%[[B]])
// CHECK:         aten::slice.Tensor"(%arg1, 3, 4, 9223372036854775807, 2)
// CHECK-NEXT:    %[[S:.*]] = bmt.aten "aten::cat"
// CHECK-NEXT:    bmt.fused "pointwise"(%[[S]])
// CHECK:         %[[R1:.*]] = bmt.aten "aten::slice.Tensor"(%arg1, 3, 0, 4, 1)
// CHECK-NEXT:    aten::slice.Tensor"(%arg1, 3, 4, 9223372036854775807, 1)
// CHECK-NEXT:    %[[R:.*]] = bmt.aten "aten::cat"
// CHECK-NEXT:    bmt.fused "pointwise"(%[[R]])
// CHECK:         aten::slice.Tensor"(%arg2, 3, 4, 9223372036854775807, 1)
// CHECK-NEXT:    %[[T:.*]] = bmt.aten "aten::cat"
// CHECK-NEXT:    bmt.fused "pointwise"(%[[T]])
// CHECK:         %[[N:.*]] = bmt.fused "pointwise"(%arg2)
// CHECK-NEXT:    ^bb0(
// CHECK-NEXT:      aten::slice.Tensor
// CHECK-NEXT:      aten::slice.Tensor
// CHECK-NEXT:      aten::neg
// CHECK-NEXT:      aten::cat
// CHECK-NEXT:      bmt.yield
// CHECK:         bmt.fused "row"(%[[N]])
// CHECK-NOT:       aten::cat
// CHECK:         return %[[A]], %{{.*}}, %{{.*}}, %{{.*}}, %[[R1]],
// REMARK: remark: bmt-fuse-elementwise: 15 ops in 6 regions (1 with a last-dim reduction, 1 rotate_half) in 1 function (not_rotate_half)
module {
  func.func private @not_rotate_half(%arg0: !bmt.tensor, %arg1: !bmt.tensor, %arg2: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) {
    // halves of exp(x) * 2
    %e = bmt.aten "aten::exp"(%arg0) : (!bmt.tensor) -> !bmt.tensor
    %c2 = bmt.constant dense<2.0> : tensor<f64>
    %v = bmt.aten "aten::mul.Tensor"(%e, %c2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %a1 = bmt.aten "aten::slice.Tensor"(%v, 3, 0, 4, 1) : (!bmt.tensor) -> !bmt.tensor
    %a2 = bmt.aten "aten::slice.Tensor"(%v, 3, 4, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
    %a3 = bmt.aten "aten::neg"(%a2) : (!bmt.tensor) -> !bmt.tensor
    %a4 = bmt.aten "aten::cat"([%a3, %a1], -1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    // unequal halves
    %b1 = bmt.aten "aten::slice.Tensor"(%arg1, 3, 0, 4, 1) : (!bmt.tensor) -> !bmt.tensor
    %b2 = bmt.aten "aten::slice.Tensor"(%arg1, 3, 3, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
    %b3 = bmt.aten "aten::cat"([%b2, %b1], -1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %b4 = bmt.aten "aten::exp"(%b3) : (!bmt.tensor) -> !bmt.tensor
    %b5 = bmt.aten "aten::sin"(%b4) : (!bmt.tensor) -> !bmt.tensor
    // a step
    %s1 = bmt.aten "aten::slice.Tensor"(%arg1, 3, 0, 4, 2) : (!bmt.tensor) -> !bmt.tensor
    %s2 = bmt.aten "aten::slice.Tensor"(%arg1, 3, 4, 9223372036854775807, 2) : (!bmt.tensor) -> !bmt.tensor
    %s3 = bmt.aten "aten::cat"([%s2, %s1], -1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %s4 = bmt.aten "aten::exp"(%s3) : (!bmt.tensor) -> !bmt.tensor
    %s5 = bmt.aten "aten::sin"(%s4) : (!bmt.tensor) -> !bmt.tensor
    // another reader of a slice
    %r1 = bmt.aten "aten::slice.Tensor"(%arg1, 3, 0, 4, 1) : (!bmt.tensor) -> !bmt.tensor
    %r2 = bmt.aten "aten::slice.Tensor"(%arg1, 3, 4, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
    %r3 = bmt.aten "aten::cat"([%r2, %r1], -1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %r4 = bmt.aten "aten::exp"(%r3) : (!bmt.tensor) -> !bmt.tensor
    %r5 = bmt.aten "aten::sin"(%r4) : (!bmt.tensor) -> !bmt.tensor
    // two tensors
    %t1 = bmt.aten "aten::slice.Tensor"(%arg1, 3, 0, 4, 1) : (!bmt.tensor) -> !bmt.tensor
    %t2 = bmt.aten "aten::slice.Tensor"(%arg2, 3, 4, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
    %t3 = bmt.aten "aten::cat"([%t2, %t1], -1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %t4 = bmt.aten "aten::exp"(%t3) : (!bmt.tensor) -> !bmt.tensor
    %t5 = bmt.aten "aten::sin"(%t4) : (!bmt.tensor) -> !bmt.tensor
    // next to a reduction: sum(rotate_half(x), -1) * 2
    %n1 = bmt.aten "aten::slice.Tensor"(%arg2, 3, 0, 4, 1) : (!bmt.tensor) -> !bmt.tensor
    %n2 = bmt.aten "aten::slice.Tensor"(%arg2, 3, 4, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
    %n3 = bmt.aten "aten::neg"(%n2) : (!bmt.tensor) -> !bmt.tensor
    %n4 = bmt.aten "aten::cat"([%n3, %n1], -1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %n5 = bmt.aten "aten::exp"(%n4) : (!bmt.tensor) -> !bmt.tensor
    %n6 = bmt.aten "aten::sum.dim_IntList"(%n5, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %n7 = bmt.aten "aten::mul.Tensor"(%n6, %c2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %a4, %b5, %s5, %r5, %r1, %t5, %n7, %e : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
  }
}

// -----

// A residual sum that the norm after it reads and the next residual add
// reads again (after the region's root) is the region's second result; a
// value derived from the reduction alone (the rsqrt, read later) is not:
// the region is then grown without second results and that value stays an
// input of its own region's readers.
// SECOND-LABEL: func.func private @residual_norm(
// SECOND-NEXT:    %[[R:.*]]:2 = bmt.fused "row"(%arg0, %arg1, %arg2) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
// SECOND-NEXT:    ^bb0(
// SECOND-NEXT:      %[[H:.*]] = bmt.aten "aten::add.Tensor"
// SECOND-NEXT:      bmt.aten "aten::layer_norm"(%[[H]],
// SECOND-NEXT:      bmt.yield %{{.*}}, %[[H]] : !bmt.tensor, !bmt.tensor
// SECOND:         %[[M:.*]] = bmt.aten "aten::matmul"(%[[R]]#0, %arg1)
// SECOND-NEXT:    %[[OUT:.*]] = bmt.aten "aten::add.Tensor"(%[[R]]#1, %[[M]], 1)
// SECOND-LABEL: func.func private @row_value_read_later(
// SECOND-NEXT:    %[[RS:.*]] = bmt.fused "row"(%arg0) : (!bmt.tensor) -> !bmt.tensor
// SECOND:           aten::mean.dim
// SECOND-NEXT:      aten::rsqrt
// SECOND:         bmt.fused "pointwise"(%arg0, %[[RS]]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
// SECOND:         bmt.aten "aten::sigmoid"(%[[RS]])
// SECOND-REMARK: remark: bmt-fuse-elementwise: 6 ops in 3 regions (2 with a last-dim reduction, 1 with a second result) in 2 functions (residual_norm ... row_value_read_later)
module {
  func.func private @residual_norm(%x: !bmt.tensor, %y: !bmt.tensor, %w: !bmt.tensor) -> !bmt.tensor {
    %h = bmt.aten "aten::add.Tensor"(%x, %y, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %n = bmt.aten "aten::layer_norm"(%h, [8], %w, %w, 1.000000e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %m = bmt.aten "aten::matmul"(%n, %y) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %o = bmt.aten "aten::add.Tensor"(%h, %m, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %o : !bmt.tensor
  }
  func.func private @row_value_read_later(%x: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
    %m = bmt.aten "aten::mean.dim"(%x, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %r = bmt.aten "aten::rsqrt"(%m) : (!bmt.tensor) -> !bmt.tensor
    %n = bmt.aten "aten::mul.Tensor"(%x, %r) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %t = bmt.aten "aten::tanh"(%n) : (!bmt.tensor) -> !bmt.tensor
    %s = bmt.aten "aten::sigmoid"(%r) : (!bmt.tensor) -> !bmt.tensor
    return %t, %s : !bmt.tensor, !bmt.tensor
  }
}

// -----

// With second-results a norm submodule, which reads its weight, is inlined
// too and joins the caller's region, and its callee, left without calls,
// goes (the activation's stays, as without second-results); one that holds
// a matmul is called as before.
// SECOND-LABEL: func.func private @mlp2(
// SECOND-NEXT:    %[[W:.*]] = bmt.get_global @scale2
// SECOND-NEXT:    %[[P:.*]] = call @proj2(%arg0)
// SECOND-NEXT:    %[[Y:.*]] = bmt.fused "pointwise"(%arg0, %[[W]], %arg1, %[[P]])
// SECOND-NEXT:    ^bb0(
// SECOND-NEXT:      aten::silu
// SECOND-NEXT:      aten::mul.Tensor
// SECOND-NEXT:      aten::mul.Tensor
// SECOND-NEXT:      aten::add.Tensor
// SECOND-NEXT:      aten::add.Tensor
// SECOND-NEXT:      bmt.yield
// SECOND-NEXT:    }
// SECOND-NEXT:    return %[[Y]]
// SECOND:         func.func private @act2(
// SECOND-NOT:     func.func private @norm2(
// SECOND:         func.func private @proj2(
// SECOND-REMARK: remark: bmt-fuse-elementwise: 5 ops in 1 region (0 with a last-dim reduction) in 1 function (mlp2); 2 calls of fusible submodules inlined
module {
  bmt.parameter @scale2 : tensor<8xf32> {requires_grad}
  func.func private @mlp2(%g: !bmt.tensor, %u: !bmt.tensor) -> !bmt.tensor {
    %0 = call @act2(%g) : (!bmt.tensor) -> !bmt.tensor
    %n = call @norm2(%g) : (!bmt.tensor) -> !bmt.tensor
    %p = call @proj2(%g) : (!bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::mul.Tensor"(%0, %u) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %2 = bmt.aten "aten::add.Tensor"(%1, %n, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %3 = bmt.aten "aten::add.Tensor"(%2, %p, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %3 : !bmt.tensor
  }
  func.func private @act2(%x: !bmt.tensor) -> !bmt.tensor {
    %0 = bmt.aten "aten::silu"(%x) : (!bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
  func.func private @norm2(%x: !bmt.tensor) -> !bmt.tensor {
    %w = bmt.get_global @scale2 : !bmt.tensor
    %0 = bmt.aten "aten::mul.Tensor"(%x, %w) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
  func.func private @proj2(%x: !bmt.tensor) -> !bmt.tensor {
    %0 = bmt.aten "aten::matmul"(%x, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
}

