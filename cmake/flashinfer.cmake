# FlashInfer (attention kernel 5, kernels/cuda/flashinfer.cu): the headers of the pinned flashinfer-python wheel,
# which scripts/setup.sh downloads (sha256 checked) and extracts into KVB_FLASHINFER_DIR. Only the instantiations
# kvbench calls are compiled (kernels/cuda/flashinfer/*.cu: batch decode over paged KV, head_dim 64, 128 and 256;
# FA2 causal batch prefill over paged KV, head_dim 64 and 128, query tiles 64 and 128; f16 K/V), into one shared library, libkvb_flashinfer.so, so the binaries that link kvb_kernels share one copy
# (the GPU bundle carries it in bin/lib like the CUDA runtime). Included by CMakeLists.txt after kvb_kernels.
#   KVB_FLASHINFER       auto (on when the headers are found) | on (fail without them) | off
#   KVB_FLASHINFER_DIR   where setup.sh put them (default ~/.cache/kvbench/flashinfer-0.7.2.post1)
#   KVB_FLASHINFER_ARCHS the CUDA architectures of its kernels (default: the project's)
set(KVB_FLASHINFER_VERSION 0.7.2.post1)
set(KVB_FLASHINFER "auto" CACHE STRING "FlashInfer attention kernels (kernel 5): auto|on|off")
if(DEFINED ENV{KVB_FLASHINFER_DIR})
  set(kvb_fi_default_dir $ENV{KVB_FLASHINFER_DIR})
elseif(DEFINED ENV{XDG_CACHE_HOME})
  set(kvb_fi_default_dir $ENV{XDG_CACHE_HOME}/kvbench/flashinfer-${KVB_FLASHINFER_VERSION})
else()
  set(kvb_fi_default_dir $ENV{HOME}/.cache/kvbench/flashinfer-${KVB_FLASHINFER_VERSION})
endif()
set(KVB_FLASHINFER_DIR "${kvb_fi_default_dir}" CACHE PATH "FlashInfer headers extracted by scripts/setup.sh")
set(KVB_FLASHINFER_ARCHS "${CMAKE_CUDA_ARCHITECTURES}" CACHE STRING "CUDA architectures of the FlashInfer kernels")

set(KVB_HAVE_FLASHINFER OFF)
if(KVB_HAVE_CUDA AND NOT KVB_FLASHINFER STREQUAL "off")
  if(EXISTS ${KVB_FLASHINFER_DIR}/include/flashinfer/attention/decode.cuh
     AND EXISTS ${KVB_FLASHINFER_DIR}/cccl/libcudacxx/include/cuda/cmath)
    set(KVB_HAVE_FLASHINFER ON)
  elseif(KVB_FLASHINFER STREQUAL "on")
    message(FATAL_ERROR "KVB_FLASHINFER=on but ${KVB_FLASHINFER_DIR} holds no FlashInfer headers (scripts/setup.sh)")
  endif()
endif()

if(KVB_HAVE_FLASHINFER)
  add_library(kvb_flashinfer SHARED
    kernels/cuda/flashinfer/decode_d64.cu kernels/cuda/flashinfer/decode_d128.cu kernels/cuda/flashinfer/decode_d256.cu
    kernels/cuda/flashinfer/prefill_d64.cu kernels/cuda/flashinfer/prefill_d128.cu)
  target_include_directories(kvb_flashinfer PRIVATE ${CMAKE_SOURCE_DIR})
  # its own CCCL first: FlashInfer's fastdiv needs cuda::fast_mod_div, newer than CUDA 13.0's libcu++
  target_include_directories(kvb_flashinfer SYSTEM BEFORE PRIVATE ${KVB_FLASHINFER_DIR}/cccl/libcudacxx/include
                             ${KVB_FLASHINFER_DIR}/include)
  target_compile_options(kvb_flashinfer PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3 --expt-relaxed-constexpr>)
  set_target_properties(kvb_flashinfer PROPERTIES CUDA_ARCHITECTURES "${KVB_FLASHINFER_ARCHS}" CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON CUDA_SEPARABLE_COMPILATION OFF)
  target_link_libraries(kvb_flashinfer PRIVATE CUDA::cudart)
  target_link_libraries(kvb_kernels PUBLIC kvb_flashinfer)
  target_compile_definitions(kvb_kernels PRIVATE KVB_HAVE_FLASHINFER=1)
  message(STATUS "kvbench: FlashInfer ${KVB_FLASHINFER_VERSION} kernels from ${KVB_FLASHINFER_DIR} (archs ${KVB_FLASHINFER_ARCHS})")
elseif(KVB_HAVE_CUDA)
  message(STATUS "kvbench: FlashInfer headers not found in ${KVB_FLASHINFER_DIR} (scripts/setup.sh): attention kernel 5 falls back")
endif()
