# deltacast_target_defaults(target): warnings (as errors when DELTACAST_WERROR), sanitizers.
function(deltacast_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
      -Woverloaded-virtual -Wimplicit-fallthrough>)
  if(DELTACAST_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(DELTACAST_SANITIZE)
    # GCC 12's -Wstringop-overflow and -Warray-bounds misfire on std::vector fills under
    # -fsanitize=address (sizes of 2^64 - 4 in stl_algobase.h): off in sanitizer builds only, so
    # -Werror still builds them.
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-stringop-overflow -Wno-array-bounds>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(DELTACAST_TSAN)
    # ThreadSanitizer (scripts/tsan.sh): the concurrency tests. Not combinable with ASan.
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
endfunction()
