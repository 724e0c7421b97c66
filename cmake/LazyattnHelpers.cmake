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
# tests/data and models/ by relative path.
function(lazyattn_cc_test)
  if(NOT BUILD_TESTING)
    return()
  endif()
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${ARG_NAME} PRIVATE ${LAZYATTN_WARNINGS})
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  gtest_discover_tests(${ARG_NAME} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                       PROPERTIES LABELS "${ARG_LABELS}" DISCOVERY_TIMEOUT 60)
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
