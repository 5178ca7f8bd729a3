# BMT_STATIC_LLVM: a portable bmt-opt (docs/status.md, "Portable bmt-opt").
#
# Debian's LLVMConfig sets LLVM_LINK_LLVM_DYLIB, so every imported MLIR
# target lists the shared `LLVM` (libLLVM.so.22.1, which needs libz3,
# libxml2, libedit, libicu, ...) in its INTERFACE_LINK_LIBRARIES. The MLIR
# archives are static already; this file swaps `LLVM` for the static LLVM
# component archives (/usr/lib/llvm-22/lib/libLLVM*.a) that MLIR really
# uses, so bmt-opt carries MLIR and LLVM inside and needs only LibTorch
# (libtorch_cpu, libc10) and the C/C++ runtime at run time.
#
# Included from the top-level CMakeLists.txt after find_package(MLIR), in the
# directory that owns the imported targets. bmt-opt itself calls
# bmt_portable_executable() (tools/bmt-opt/CMakeLists.txt).

# The LLVM components the MLIR libraries that bmt-opt links refer to (today
# Support, Demangle, Remarks, BitstreamReader), plus Core and its base
# libraries for MLIR libraries we may add; the linker takes from an archive
# only the objects that are used, so an unused component changes nothing in
# the binary. A link error naming llvm:: symbols in a BMT_STATIC_LLVM build:
# add the component that defines them here.
set(BMT_STATIC_LLVM_COMPONENTS Support Demangle Remarks BitstreamReader
    BinaryFormat TargetParser Core)
llvm_map_components_to_libnames(BMT_STATIC_LLVM_LIBS ${BMT_STATIC_LLVM_COMPONENTS})
message(STATUS "BMT_STATIC_LLVM: MLIR links ${BMT_STATIC_LLVM_LIBS} instead of libLLVM.so")

get_property(_bmt_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
set(_bmt_rewritten 0)
foreach(_t IN LISTS _bmt_imported)
  get_target_property(_libs ${_t} INTERFACE_LINK_LIBRARIES)
  if(NOT _libs)
    continue()
  endif()
  set(_new "")
  set(_changed FALSE)
  foreach(_l IN LISTS _libs)
    if(_l STREQUAL "LLVM" OR _l STREQUAL "$<LINK_ONLY:LLVM>")
      list(APPEND _new ${BMT_STATIC_LLVM_LIBS})
      set(_changed TRUE)
    else()
      list(APPEND _new "${_l}")
    endif()
  endforeach()
  if(_changed)
    list(REMOVE_DUPLICATES _new)
    set_target_properties(${_t} PROPERTIES INTERFACE_LINK_LIBRARIES "${_new}")
    math(EXPR _bmt_rewritten "${_bmt_rewritten} + 1")
  endif()
endforeach()
message(STATUS "BMT_STATIC_LLVM: ${_bmt_rewritten} imported targets rewritten")

# LibTorch stays a shared library, found at run time through LD_LIBRARY_PATH
# (the user's torch/lib), not through a path of this machine: the consumer
# property BMT_PORTABLE drops the -rpath that cmake/Torch.cmake puts on
# bmt::torch_cpu.
get_target_property(_opts bmt_torch_cpu INTERFACE_LINK_OPTIONS)
if(_opts)
  set_target_properties(bmt_torch_cpu PROPERTIES INTERFACE_LINK_OPTIONS
    "$<$<NOT:$<BOOL:$<TARGET_PROPERTY:BMT_PORTABLE>>>:${_opts}>")
endif()

# bmt_portable_executable(target): no RPATH/RUNPATH at all, and
# --as-needed so that a library is NEEDED only when a symbol of it is used
# (LLVMSupport lists libz3, zlib and zstd; only the last two are used).
function(bmt_portable_executable target)
  set_target_properties(${target} PROPERTIES
    BMT_PORTABLE ON
    SKIP_BUILD_RPATH ON
    INSTALL_RPATH "")
  target_link_options(${target} PRIVATE -Wl,--as-needed)
endfunction()

# ctest runs bmt-opt (lit, pytest) from the build tree: give the tests this
# machine's torch/lib, as a user does on theirs.
file(WRITE ${PROJECT_BINARY_DIR}/BmtTestEnv.cmake
  "set(ENV{LD_LIBRARY_PATH} \"${BMT_TORCH_DIR}/lib:\$ENV{LD_LIBRARY_PATH}\")\n")
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY
  TEST_INCLUDE_FILES ${PROJECT_BINARY_DIR}/BmtTestEnv.cmake)
