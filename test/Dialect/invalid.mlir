// RUN: bmt-opt %s --split-input-file --verify-diagnostics

func.func @f(%x: !bmt.tensor) {
  // expected-error @+1 {{calls 'aten::erfinv', which is not in bmt's operator registry}}
  %0 = bmt.aten "aten::erfinv"(%x) : (!bmt.tensor) -> !bmt.tensor
  return
}

// -----

func.func @f(%x: !bmt.tensor) {
  // expected-error @+1 {{'aten::linear' takes 3 arguments, got 2}}
  %0 = bmt.aten "aten::linear"(%x, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return
}

// -----

func.func @f(%x: !bmt.tensor) {
  // expected-error @+1 {{'aten::linear' returns 1 values, got 2 results}}
  %0:2 = bmt.aten "aten::linear"(%x, %x, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
  return
}

// -----

func.func @f(%x: !bmt.tensor) {
  // expected-error @+1 {{has an argument that is not a schema constant}}
  %0 = bmt.aten "aten::gelu"(%x, unit) : (!bmt.tensor) -> !bmt.tensor
  return
}

// -----

func.func @f(%x: !bmt.tensor) {
  // expected-error @+1 {{expected 1 operand types, got 2}}
  %0 = bmt.aten "aten::relu"(%x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return
}

// -----

// expected-error @+1 {{needs a static shape}}
bmt.parameter @w : tensor<?x4xf32>

// -----

// expected-error @+1 {{has an element type PyTorch has no dtype for}}
bmt.parameter @w : tensor<4xf8E4M3FN>

// -----

// expected-error @+1 {{lists the name 'w' twice}}
bmt.parameter @w : tensor<4xf32> {aliases = ["w"]}

// -----

func.func @f() {
  // expected-error @+1 {{refers to an undefined symbol @nope}}
  %0 = bmt.get_global @nope : !bmt.tensor
  return
}

// -----

func.func @g() { return }
func.func @f() {
  // expected-error @+1 {{refers to @g, which is not a bmt.parameter or bmt.buffer}}
  %0 = bmt.get_global @g : !bmt.tensor
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{cannot hold}}
  %0 = bmt.constant 3 : i32
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{expects parent op 'builtin.module'}}
  bmt.parameter @w : tensor<4xf32>
  return
}

// -----

// expected-error @+1 {{has more elements than fit in int64}}
bmt.parameter @w : tensor<4611686018427387904x4xf32>

// -----

bmt.parameter @w : tensor<4xf32>
// expected-error @+1 {{offset 3 is not increasing and aligned to 64 bytes}}
bmt.storage_group @g : f32 {alignment = 64 : i64, offsets = array<i64: 3>, params = [@w], size = 32 : i64}

// -----

bmt.parameter @w : tensor<40xf32> {requires_grad}
// expected-error @+1 {{size 16 is smaller than its members' end 40}}
bmt.storage_group @g : f32 {alignment = 64 : i64, offsets = array<i64: 0>, params = [@w], size = 16 : i64}

// -----

// A group holds trainable or (frozen) frozen parameters, never both.
bmt.parameter @w : tensor<4xf32>
// expected-error @+1 {{member @w is frozen, in a trainable group}}
bmt.storage_group @g : f32 {alignment = 64 : i64, offsets = array<i64: 0>, params = [@w], size = 16 : i64}

// -----

bmt.parameter @w : tensor<4xf32> {requires_grad}
// expected-error @+1 {{member @w trains, in a frozen group}}
bmt.storage_group @g : f32 {alignment = 64 : i64, frozen, offsets = array<i64: 0>, params = [@w], size = 16 : i64}

// -----

bmt.parameter @w : tensor<4xbf16>
// expected-error @+1 {{member @w has element type 'bf16'}}
bmt.storage_group @g : f32 {alignment = 64 : i64, offsets = array<i64: 0>, params = [@w], size = 16 : i64}

// -----

// #bmt.tensor_split: the attribute's own checks.
// expected-error @+1 {{#bmt.tensor_split: chunks must be at least 1 (it is 0)}}
bmt.parameter @w : tensor<8x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 0>}

// -----

// expected-error @+1 {{#bmt.tensor_split: reduce_grad is for replicated tensors (split dim is 0)}}
bmt.parameter @w : tensor<8x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, reduce_grad = true>}

// -----

// On a parameter: the dim against its shape, the padding against its size.
// expected-error @+1 {{bmt.tensor_split: dim 2 is out of range for a 2-d tensor}}
bmt.parameter @w : tensor<8x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 2, chunks = 1>}

// -----

// expected-error @+1 {{bmt.tensor_split: padded_size 6 is smaller than dim 0 (8)}}
bmt.parameter @w : tensor<8x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, padded_size = 6>}

// -----

// With T known (bmt.tensor_parallel), the padded size divides by chunks * T.
module attributes {bmt.tensor_parallel = 4 : i64} {
  // expected-error @+1 {{bmt.tensor_split: dim 1 of size 6 is not a multiple of chunks (3) times tensor_parallel (4)}}
  bmt.parameter @qkv : tensor<2x6xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 3>}
}

// -----

// A split over the expert group: dim 0, chunks 1, no padding; E (the
// module's bmt.expert_parallel) divides the experts; on a parameter only.
// expected-error @+1 {{#bmt.tensor_split: an expert split is of dim 0 (the experts), chunks 1 and no padded_size (it is dim 1, chunks 1, padded_size 0)}}
bmt.parameter @w : tensor<8x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 1, over = "expert">}

// -----

// expected-error @+1 {{#bmt.tensor_split: over must be "tensor" or "expert", not "pipeline"}}
bmt.parameter @w : tensor<8x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "pipeline">}

// -----

module attributes {bmt.expert_parallel = 3 : i64, bmt.tensor_parallel = 2 : i64} {
  // expected-error @+1 {{bmt.tensor_split: dim 0 of size 8 is not a multiple of expert_parallel (3)}}
  bmt.parameter @experts : tensor<8x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">}
}

// -----

// expected-error @+1 {{bmt.tensor_split: a split over the expert group is for a parameter}}
bmt.buffer @bias : tensor<8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">}

// -----

// expected-error @+1 {{bmt.tensor_split must be a #bmt.tensor_split}}
bmt.parameter @w : tensor<8x4xf32> {bmt.tensor_split = {dim = 0 : i64, chunks = 1 : i64}}
