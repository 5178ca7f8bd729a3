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

bmt.parameter @w : tensor<40xf32>
// expected-error @+1 {{size 16 is smaller than its members' end 40}}
bmt.storage_group @g : f32 {alignment = 64 : i64, offsets = array<i64: 0>, params = [@w], size = 16 : i64}

// -----

bmt.parameter @w : tensor<4xbf16>
// expected-error @+1 {{member @w has element type 'bf16'}}
bmt.storage_group @g : f32 {alignment = 64 : i64, offsets = array<i64: 0>, params = [@w], size = 16 : i64}
