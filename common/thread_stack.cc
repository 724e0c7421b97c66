// Raises small thread stack requests process-wide.
//
// glibc places a thread's static TLS at the top of the stack it is given, so a thread started
// with an explicit small stack cannot start at all (EINVAL) once the process's static TLS comes
// near that size. civetweb, inside prometheus-cpp's exposer, asks for exactly 100 KiB (Debian's
// build; objdump shows `mov $0x19000,%esi` before each call), and the CUDA worker links cuBLASLt,
// whose static TLS is 94 KiB (readelf -l: TLS memsz 0x17020). The library offers no run-time
// setting, so this definition interposes on glibc's: the executable's symbol wins over libc's
// for every shared library (CMake exports it with --export-dynamic-symbol). Requests of at least
// kMinStack pass unchanged; memory of a larger stack is reserved, not touched.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {

constexpr size_t kMinStack = size_t{1} << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize Real() {
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int pthread_attr_setstacksize(
    pthread_attr_t* attr, size_t size) {
  const SetStackSize real = Real();
  if (real == nullptr) return 0;  // keep the default stack (8 MiB), which always fits
  return real(attr, size < kMinStack ? kMinStack : size);
}
