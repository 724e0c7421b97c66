# Module helpers in the spirit of Abseil's absl_cc_library / absl_cc_test: a module declares its
# library and its tests next to each other, and every target gets the same include root and flags.
include_guard(GLOBAL)

# lazyattn_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [PUBLIC_DEPS ...])
function(lazyattn_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;HDRS;DEPS;PUBLIC_DEPS" ${ARGN})
  if(ARG_SRCS)
    add_library(${ARG_NAME} STATIC ${ARG_SRCS} ${ARG_HDRS})
    target_include_directories(${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${ARG_NAME} PUBLIC ${ARG_PUBLIC_DEPS} ${ARG_DEPS})
    target_compile_options(${ARG_NAME} PRIVATE ${LAZYATTN_WARNINGS})
  else()
    add_library(${ARG_NAME} INTERFACE ${ARG_HDRS})
    target_include_directories(${ARG_NAME} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${ARG_NAME} INTERFACE ${ARG_PUBLIC_DEPS} ${ARG_DEPS})
  endif()
endfunction()

# lazyattn_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...])
# Registers a GoogleTest binary with CTest. Tests run from the repository root so they can find
# tests/data and models/ by relative path. Each test is also labelled with its binary's name, so
# `ctest -L '^cache_test$'` runs one binary's tests (the sanitizer stage selects them this way).
function(lazyattn_cc_test)
  if(NOT BUILD_TESTING)
    return()
  endif()
  # SERIAL: ctest runs these tests alone (measurements of the process that parallel tests disturb).
  cmake_parse_arguments(ARG "SERIAL" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${ARG_NAME} PRIVATE ${LAZYATTN_WARNINGS})
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(labels ${ARG_LABELS} ${ARG_NAME})
  set(serial FALSE)
  if(ARG_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${ARG_NAME} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                       PROPERTIES LABELS "${labels}" RUN_SERIAL ${serial} DISCOVERY_TIMEOUT 60)
endfunction()

# lazyattn_cc_binary(NAME name SRCS ... [DEPS ...]): a program that lands in build/bin/.
function(lazyattn_cc_binary)
  cmake_parse_arguments(ARG "" "NAME;OUTPUT_NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  target_compile_options(${ARG_NAME} PRIVATE ${LAZYATTN_WARNINGS})
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  if(ARG_OUTPUT_NAME)
    set_target_properties(${ARG_NAME} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
endfunction()

# lazyattn_add_fuzzer(NAME name SOURCES ... [LIBS ...])
# A fuzz target is one source defining LLVMFuzzerTestOneInput (tests/fuzz/<name>_fuzz.cc). Every build
# with tests makes `fuzz_<name>_replay`, which runs each file of tests/fuzz/corpus/<name> and
# tests/fuzz/regressions/<name> through the target once and is registered as the CTest test of that
# name, so a crash found once stays fixed under any compiler. A clang build with -DLAZYATTN_FUZZ=ON
# also makes the libFuzzer binary `fuzz_<name>` (ASan + UBSan), which tests/fuzz/run.sh runs for a
# bounded time.
function(lazyattn_add_fuzzer)
  if(NOT BUILD_TESTING)
    return()
  endif()
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBS" ${ARGN})
  set(fuzz_dir ${PROJECT_SOURCE_DIR}/tests/fuzz)

  add_executable(fuzz_${ARG_NAME}_replay ${ARG_SOURCES} ${fuzz_dir}/replay_main.cc)
  target_link_libraries(fuzz_${ARG_NAME}_replay PRIVATE ${ARG_LIBS})
  target_compile_options(fuzz_${ARG_NAME}_replay PRIVATE ${LAZYATTN_WARNINGS})
  set_target_properties(fuzz_${ARG_NAME}_replay PROPERTIES
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME fuzz_${ARG_NAME}_replay
           COMMAND fuzz_${ARG_NAME}_replay ${fuzz_dir}/corpus/${ARG_NAME}
                   ${fuzz_dir}/regressions/${ARG_NAME}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(fuzz_${ARG_NAME}_replay PROPERTIES LABELS "fuzz;fuzz_${ARG_NAME}_replay")

  if(LAZYATTN_FUZZ)
    add_executable(fuzz_${ARG_NAME} ${ARG_SOURCES})
    target_link_libraries(fuzz_${ARG_NAME} PRIVATE ${ARG_LIBS})
    target_compile_options(fuzz_${ARG_NAME} PRIVATE ${LAZYATTN_WARNINGS})
    # Every object already carries -fsanitize=fuzzer-no-link (coverage); this links libFuzzer's main.
    target_link_options(fuzz_${ARG_NAME} PRIVATE -fsanitize=fuzzer)
    set_target_properties(fuzz_${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
  endif()
endfunction()
