# ctest check of the portable bmt-opt (BMT_STATIC_LLVM=ON), run as
#   cmake -DBIN=<bmt-opt> -DTORCH_LIB=<torch/lib> -DREADELF=<readelf> -P CheckPortable.cmake
# Fails unless BIN needs only LibTorch and the C/C++ runtime, has no
# RPATH/RUNPATH, and runs `--version` in an empty environment whose only
# library path is TORCH_LIB.
cmake_minimum_required(VERSION 3.20)
set(_allowed libtorch_cpu.so libc10.so libstdc++.so.6 libm.so.6 libgcc_s.so.1
    libc.so.6 ld-linux-x86-64.so.2 libz.so.1 libzstd.so.1)
execute_process(COMMAND ${READELF} -d ${BIN} OUTPUT_VARIABLE _dyn RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${BIN} failed")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]]*\\]" _needed "${_dyn}")
set(_bad "")
foreach(_n IN LISTS _needed)
  string(REGEX REPLACE ".*\\[(.*)\\]" "\\1" _lib "${_n}")
  message(STATUS "NEEDED ${_lib}")
  if(NOT _lib IN_LIST _allowed)
    list(APPEND _bad ${_lib})
  endif()
endforeach()
if(_bad)
  message(FATAL_ERROR "${BIN} needs libraries a GPU machine lacks: ${_bad}")
endif()
if(_dyn MATCHES "\\((RPATH|RUNPATH)\\)[^\n]*")
  message(FATAL_ERROR "${BIN} has a library path of this machine: ${CMAKE_MATCH_0}")
endif()
execute_process(COMMAND env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH=${TORCH_LIB} ${BIN} --version
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${BIN} --version in an empty environment failed (${_rc}): ${_out}${_err}")
endif()
message(STATUS "portable: ${_out}")
