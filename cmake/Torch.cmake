# LibTorch from the pip wheel (torch==2.11.0, see scripts/requirements.txt).
#
# Defines:
#   bmt::torch_cpu  - ATen, the TorchScript loader, c10 (no CUDA): what the
#                     compiler's importer and the CPU runtime need.
#   bmt::torch      - the above plus LibTorch's CUDA backend: what bmt-run links.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE)
list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
# The wheel's CUDA config probes the GPU; there is none on the build machines.
set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for LibTorch extensions (H200: 9.0)")
find_package(Torch REQUIRED)

add_library(bmt_torch_cpu INTERFACE)
target_include_directories(bmt_torch_cpu SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_link_libraries(bmt_torch_cpu INTERFACE
  ${BMT_TORCH_DIR}/lib/libtorch_cpu.so
  ${BMT_TORCH_DIR}/lib/libc10.so)
set_target_properties(bmt_torch_cpu PROPERTIES
  INTERFACE_LINK_OPTIONS "-Wl,-rpath,${BMT_TORCH_DIR}/lib")
add_library(bmt::torch_cpu ALIAS bmt_torch_cpu)

# bmt::torch - what the runtime links: the CPU part plus, for the CUDA build
# of the wheel, libtorch_cuda (linked with --no-as-needed by find_package's
# TORCH_LIBRARIES, so that its kernels and the CUDA backend register even
# though no symbol of it is referenced).
add_library(bmt_torch INTERFACE)
target_link_libraries(bmt_torch INTERFACE bmt_torch_cpu ${TORCH_LIBRARIES})
add_library(bmt::torch ALIAS bmt_torch)
