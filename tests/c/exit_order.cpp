/* Device buffers owned by C++ static objects, whose destructors free them at exit, after main
 * returns: one in the program, one in a library it loads with dlopen, as Python loads PyTorch.
 * Both objects are made before the first allocation. The exit summary must count their frees,
 * not list their buffers as still allocated.
 *
 * Built twice: with EXIT_ORDER_LIBRARY as the library, without it as the program.
 * usage: exit_order LIBRARY */
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>

#include "cuda_runtime.h"

namespace {

class DeviceBuffers {
  public:
    explicit DeviceBuffers(const char *owner) : owner_(owner) {}

    void allocate()
    {
        for (void *&p : buffers_) {
            if (cudaMalloc(&p, 1 << 20) != cudaSuccess) {
                std::fprintf(stderr, "FAIL: cudaMalloc in the %s\n", owner_);
                std::exit(1);
            }
        }
    }

    ~DeviceBuffers()
    {
        for (void *p : buffers_) {
            if (cudaFree(p) != cudaSuccess) {
                std::fprintf(stderr, "FAIL: cudaFree at exit in the %s\n", owner_);
                std::_Exit(1);
            }
        }
        std::printf("the %s's buffers freed at exit\n", owner_);
    }

  private:
    const char *owner_;
    void *buffers_[3] = {};
};

} // namespace

#ifdef EXIT_ORDER_LIBRARY

static DeviceBuffers library_buffers("library");

extern "C" void exit_order_library_allocate() { library_buffers.allocate(); }

#else

static DeviceBuffers program_buffers("program");

int main(int argc, char **argv)
{
    if (argc != 2) {
        std::fprintf(stderr, "usage: exit_order LIBRARY\n");
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    auto allocate = library ? reinterpret_cast<void (*)()>(
                                  dlsym(library, "exit_order_library_allocate"))
                            : nullptr;
    if (allocate == nullptr) {
        std::fprintf(stderr, "FAIL: %s\n", dlerror());
        return 1;
    }
    program_buffers.allocate();
    allocate();
    std::printf("exit_order ok\n");
    return 0;
}

#endif
