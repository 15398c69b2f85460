// api_demo.cpp: the libgpupool C API from C++17. Device buffers own their memory (RAII through
// std::unique_ptr with a deleter that calls gpupool_free), statistics are read into the C
// struct, and the summary goes to stdout.
//
// build: c++ -std=c++17 -Wall -Wextra -Werror api_demo.cpp $(pkg-config --cflags --libs gpupool)
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gpupool.h>

namespace {

struct PoolFree {
    void operator()(void *p) const noexcept { gpupool_free(p); }
};
using DeviceBuffer = std::unique_ptr<void, PoolFree>;

void check(int status, const char *what)
{
    if (status != GPUPOOL_SUCCESS)
        throw std::runtime_error(std::string(what) + " failed with error " +
                                 std::to_string(status));
}

DeviceBuffer allocate(std::size_t bytes)
{
    void *p = nullptr;
    check(gpupool_malloc(&p, bytes), "gpupool_malloc");
    return DeviceBuffer(p);
}

gpupool_stats stats()
{
    gpupool_stats st{};
    st.struct_size = sizeof st;
    check(gpupool_get_stats(GPUPOOL_ALL_DEVICES, &st), "gpupool_get_stats");
    return st;
}

}  // namespace

int main()
{
    try {
        constexpr std::size_t mib = std::size_t{1} << 20;
        for (int step = 0; step < 3; step++) {
            std::vector<DeviceBuffer> activations;
            for (std::size_t layer = 1; layer <= 12; layer++)
                activations.push_back(allocate(layer * 3 * mib));
            const auto st = stats();
            std::printf("step %d: %llu live blocks, %llu MiB reserved, %llu cache hits\n", step,
                        static_cast<unsigned long long>(st.active_allocations),
                        static_cast<unsigned long long>(st.reserved_bytes / mib),
                        static_cast<unsigned long long>(st.cache_hits));
        }  // the buffers go back to the pool here
        std::uint64_t released = 0;
        check(gpupool_empty_cache(GPUPOOL_ALL_DEVICES, &released), "gpupool_empty_cache");
        std::printf("empty_cache released %llu bytes\n",
                    static_cast<unsigned long long>(released));
        check(gpupool_write_summary(1), "gpupool_write_summary");
    } catch (const std::exception &e) {
        std::fprintf(stderr, "api_demo: %s\n", e.what());
        return 1;
    }
    return 0;
}
