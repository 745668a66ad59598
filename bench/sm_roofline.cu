// What an SM kernel can move on this GPU, next to the driver's device copy, under the same
// method as ropejit_bench (CUDA events, 256 MiB memset before every repetition, median of 30):
// the ceiling that "% of copy" is judged against. Plain copies with 1-4 16-byte vectors in
// flight per thread, the same in place (read, change, write back, as ropejit's in-place kernels
// do), and Hopper bulk copies (cp.async.bulk through shared memory, one 8 KiB row per block,
// as big as one token of q). Standalone (nvcc, runtime API); bench/run_gpu.sh roofline builds
// and runs it:
//     nvcc -O3 -arch=sm_90 -std=c++17 bench/sm_roofline.cu -o sm_roofline && ./sm_roofline
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "probe_common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kRowBytes = 8192;  // bulk-copy row: one token of 32 q heads x 128 x bf16

// kVecs 16-byte vectors per thread, all loaded before the first store. `flip` is 0 at run time:
// in place, every word is still rewritten (a store of the value just loaded could be elided).
template <int kVecs>
__global__ void __launch_bounds__(kThreads)
    copy16(const uint4* src, uint4* dst, long long n, unsigned flip) {
  const long long base = (long long)blockIdx.x * kThreads * kVecs + threadIdx.x;
  uint4 v[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
    if (base + j * kThreads < n) v[j] = src[base + j * kThreads];
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
    if (base + j * kThreads < n) {
      uint4 w = v[j];
      w.x ^= flip;
      dst[base + j * kThreads] = w;
    }
}

// One kRowBytes row per block: bulk load into shared memory, every thread rewrites its words
// (in place: the same buffer), bulk store.
__global__ void __launch_bounds__(128) bulk_rows(const char* src, char* dst, unsigned flip) {
  __shared__ alignas(128) uint4 row[kRowBytes / 16];
  __shared__ alignas(8) unsigned long long bar;
  const char* s = src + (long long)blockIdx.x * kRowBytes;
  char* d = dst + (long long)blockIdx.x * kRowBytes;
  if (threadIdx.x == 0) {
    mbar_init(&bar);
    bulk_load(row, s, kRowBytes, &bar);
  }
  __syncthreads();  // the barrier is initialised before anyone waits on it
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < kRowBytes / 16; i += blockDim.x) row[i].x ^= flip;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d),
                 "r"(smem_addr(row)), "r"(kRowBytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
}

// The L2 emptied by a 256 MiB memset (a new byte each time) before every timed call.
struct Timer {
  void* flush;
  int fill = 0;
  static constexpr size_t kFlush = size_t(256) << 20;
  Timer() { CHECK(cudaMalloc(&flush, kFlush)); }
  double us(const std::function<void()>& work) {
    return median_us([&] { CHECK(cudaMemsetAsync(flush, fill++ & 0xff, kFlush)); }, work);
  }
};

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  Timer timer;
  std::printf("%-28s", "bytes moved (read + write)");
  const size_t sizes[] = {size_t(43) << 20, size_t(86) << 20, size_t(344) << 20};
  for (size_t s : sizes) std::printf(" %15.1f MB", 2.0 * double(s) / 1e6);
  std::printf("\n");
  struct Row {
    const char* name;
    std::function<void(char*, char*, size_t)> run;
  };
  const unsigned flip = 0;
  auto grid16 = [](size_t bytes, int vecs) {
    return unsigned((bytes / 16 + kThreads * vecs - 1) / (kThreads * vecs));
  };
  const Row rows[] = {
      {"driver copy (cudaMemcpy)",
       [](char* a, char* b, size_t n) {
         CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
       }},
      {"copy, 1 x 16 B per thread",
       [&](char* a, char* b, size_t n) {
         copy16<1><<<grid16(n, 1), kThreads>>>((const uint4*)a, (uint4*)b, n / 16, flip);
       }},
      {"copy, 2 x 16 B per thread",
       [&](char* a, char* b, size_t n) {
         copy16<2><<<grid16(n, 2), kThreads>>>((const uint4*)a, (uint4*)b, n / 16, flip);
       }},
      {"copy, 4 x 16 B per thread",
       [&](char* a, char* b, size_t n) {
         copy16<4><<<grid16(n, 4), kThreads>>>((const uint4*)a, (uint4*)b, n / 16, flip);
       }},
      {"in place, 2 x 16 B",
       [&](char* a, char*, size_t n) {
         copy16<2><<<grid16(n, 2), kThreads>>>((const uint4*)a, (uint4*)a, n / 16, flip);
       }},
      {"in place, 4 x 16 B",
       [&](char* a, char*, size_t n) {
         copy16<4><<<grid16(n, 4), kThreads>>>((const uint4*)a, (uint4*)a, n / 16, flip);
       }},
      {"bulk copy, 8 KiB rows",
       [&](char* a, char* b, size_t n) {
         bulk_rows<<<unsigned(n / kRowBytes), 128>>>(a, b, flip);
       }},
      {"bulk in place, 8 KiB rows",
       [&](char* a, char*, size_t n) { bulk_rows<<<unsigned(n / kRowBytes), 128>>>(a, a, flip); }},
  };
  std::vector<std::vector<double>> us(std::size(rows));
  char *src = nullptr, *dst = nullptr;
  const size_t biggest = sizes[std::size(sizes) - 1];
  CHECK(cudaMalloc(&src, biggest));
  CHECK(cudaMalloc(&dst, biggest));
  CHECK(cudaMemset(src, 1, biggest));
  for (int round = 0; round < 2; ++round)  // interleaved, best of two rounds
    for (size_t r = 0; r < std::size(rows); ++r) {
      us[r].resize(std::size(sizes), 1e30);
      for (size_t i = 0; i < std::size(sizes); ++i)
        us[r][i] = std::min(us[r][i], timer.us([&] { rows[r].run(src, dst, sizes[i]); }));
    }
  for (size_t r = 0; r < std::size(rows); ++r) {
    std::printf("%-28s", rows[r].name);
    for (size_t i = 0; i < std::size(sizes); ++i)
      std::printf(" %8.2f us %5.1f%%", us[r][i], 100.0 * us[0][i] / us[r][i]);
    std::printf("\n");
  }
  return 0;
}
