# One libFuzzer executable per tests/fuzz/fuzz_*.c (included from the top-level CMakeLists.txt when
# KVB_FUZZ=ON). scripts/fuzz.sh builds and runs them over their seed corpora in tests/fuzz/corpus/.
file(GLOB KVB_FUZZERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_*.c)
foreach(f ${KVB_FUZZERS})
  get_filename_component(name ${f} NAME_WE)
  add_executable(${name} ${f})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/tests/fuzz)
  target_link_libraries(${name} PRIVATE kvb_benchmarks) # the top layer brings every layer beneath it
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
endforeach()
