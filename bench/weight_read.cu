// How fast one launch can read Llama-3-8B's QKV projection weight (4096 x 6144 bf16, 50 MB)
// from a cold L2: the ceiling for the decode block's fused kernel at one token, which must
// stream the whole weight once. Every row reads the same bytes and only reads them (each thread
// folds its words into one that is stored only if it takes a value it never takes). The L2 is
// flushed before every repetition by reading 256 MB, as ropejit_bench's weight rows do; CUDA
// events around the read alone, median of 30, two rounds interleaved (both printed). The copy
// floor is half a driver copy of the weight (its bytes read once and written once), as in
// ropejit_bench's floor_us. Standalone (nvcc, runtime API); bench/run_gpu.sh weightread builds
// and runs it:
//     nvcc -O3 -arch=sm_90 -std=c++17 bench/weight_read.cu -o weight_read && ./weight_read
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "probe_common.cuh"

namespace {

constexpr int kHidden = 4096;  // a weight row's elements (bf16)
constexpr int kRowBytes = kHidden * 2;
constexpr int kRows = 6144;  // (32 + 2 x 8) heads x 128
constexpr size_t kWeightBytes = size_t(kRows) * kRowBytes;
constexpr unsigned kNever = 0x9e3779b9u;

__device__ unsigned g_sink;

__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// The projection kernel's weight load, templates/proj_kernel.cuh's load_stream16 repeated here
// (this probe is built by nvcc alone, without the NVRTC templates): not kept in L1, the L2
// asked for the surrounding 256 B.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The library's read pass (autotune/timing.cpp, ropejit_bench's read_us): grid-stride, four
// vectors per thread and step.
__global__ void __launch_bounds__(256) grid_stride(const uint4* p, unsigned long long n) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride)
    acc ^= fold(p[i]) ^ fold(p[i + stride]) ^ fold(p[i + 2 * stride]) ^ fold(p[i + 3 * stride]);
  for (; i < n; i += stride) acc ^= fold(p[i]);
  if (acc == kNever) g_sink = acc;
}

// One step: each thread kVecs vectors, 256 threads apart, then exits (a grid of many waves).
template <int kVecs>
__global__ void __launch_bounds__(256) one_step(const uint4* p) {
  const unsigned long long base = (unsigned long long)blockIdx.x * 256 * kVecs + threadIdx.x;
  uint4 v[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) v[j] = load_stream16(p + base + j * 256);
  unsigned acc = 0;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) acc ^= fold(v[j]);
  if (acc == kNever) g_sink = acc;
}

// The one-tile projection kernel's order (templates/proj_kernel.cuh, m1s8u<kUnroll>): block b
// owns 16 weight rows, lane (g, t) of warp w loads 16 bytes of two of them (here rows g and
// g + 8; in the kernel a rotary pair's two columns) at 8t elements into each 32-element chunk,
// the warp kUnroll chunks per iteration, the block's 8 warps
// adjacent chunks, two iterations in flight (loaded one ahead, as the kernel's stages are).
// 384 blocks, or (kSplitK > 1) kSplitK blocks per 16 rows, each a slice of the hidden
// dimension, as a cluster's blocks take them; kMinBlocks resident per SM as the kernel's launch
// bounds ask.
template <int kUnroll, int kMinBlocks, int kSplitK = 1>
__global__ void __launch_bounds__(256, kMinBlocks) projection_order(const char* w) {
  constexpr int kChunkBytes = 64;
  constexpr int kStep = 8 * kUnroll * kChunkBytes;  // a row's bytes per block iteration
  constexpr int kSliceBytes = kRowBytes / kSplitK;
  constexpr int kIters = kSliceBytes / kStep;
  static_assert(kIters >= 1, "a slice holds at least one iteration");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const long long group = blockIdx.x / kSplitK, slice = blockIdx.x % kSplitK;
  const char* ra = w + (group * 16 + g) * kRowBytes + slice * kSliceBytes +
                   warp * kUnroll * kChunkBytes + 16 * t;
  const char* rb = ra + 8 * kRowBytes;
  uint4 stage[2][2 * kUnroll];
  auto load = [&](uint4* s, int it) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      s[2 * u] = load_stream16(ra + kStep * it + kChunkBytes * u);
      s[2 * u + 1] = load_stream16(rb + kStep * it + kChunkBytes * u);
    }
  };
  unsigned acc = 0;
  load(stage[0], 0);
#pragma unroll 1
  for (int it = 0; it < kIters; it += 2) {
    if (it + 1 < kIters) load(stage[1], it + 1);
#pragma unroll
    for (int j = 0; j < 2 * kUnroll; ++j) acc ^= fold(stage[0][j]);
    if (it + 1 >= kIters) break;
    if (it + 2 < kIters) load(stage[0], it + 2);
#pragma unroll
    for (int j = 0; j < 2 * kUnroll; ++j) acc ^= fold(stage[1][j]);
  }
  if (acc == kNever) g_sink = acc;
}

// Bulk copies (sm_90 TMA, no registers in flight): block b streams its 128 KB (the 16 rows the
// projection's block owns) through kStages stages of kStageBytes in shared memory, thread 0
// issuing each stage's copy, every thread folding its words once the stage has arrived.
template <int kStages, int kStageBytes>
__global__ void __launch_bounds__(256) bulk_ring(const char* w) {
  constexpr int kBlockBytes = 16 * kRowBytes;
  constexpr int kCount = kBlockBytes / kStageBytes;
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) unsigned long long bars[kStages];
  const char* src = w + (long long)blockIdx.x * kBlockBytes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&bars[s]);
    for (int s = 0; s < kStages && s < kCount; ++s)
      bulk_load(ring + s * (kStageBytes / 16), src + (long long)s * kStageBytes, kStageBytes,
                &bars[s]);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  unsigned acc = 0;
  for (int i = 0; i < kCount; ++i) {
    const int s = i % kStages;
    mbar_wait(&bars[s], (i / kStages) & 1);
    const uint4* stage = ring + s * (kStageBytes / 16);
    for (int j = threadIdx.x; j < kStageBytes / 16; j += 256) acc ^= fold(stage[j]);
    __syncthreads();  // every thread is done with stage s before it is refilled
    if (threadIdx.x == 0 && i + kStages < kCount)
      bulk_load(ring + s * (kStageBytes / 16), src + (long long)(i + kStages) * kStageBytes,
                kStageBytes, &bars[s]);
  }
  if (acc == kNever) g_sink = acc;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %d MB; weight %zu bytes\n", prop.name, sms, prop.l2CacheSize >> 20,
              kWeightBytes);
  const size_t flush_bytes = size_t(256) << 20;
  char *w = nullptr, *dst = nullptr, *flush = nullptr;
  CHECK(cudaMalloc(&w, kWeightBytes));
  CHECK(cudaMalloc(&dst, kWeightBytes));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMemset(w, 1, kWeightBytes));
  CHECK(cudaMemset(flush, 2, flush_bytes));
  // The L2 emptied by reading 256 MB before every timed call.
  auto time = [&](const std::function<void()>& work) {
    return median_us(
        [&] {
          grid_stride<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(flush), flush_bytes / 16);
        },
        work);
  };
  const uint4* p = reinterpret_cast<const uint4*>(w);
  const unsigned long long n = kWeightBytes / 16;
  // A bulk-ring row: its shared memory granted first.
  auto bulk = [&](auto kernel, int bytes) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return [=] { kernel<<<kRows / 16, 256, bytes>>>(w); };
  };
  struct Row {
    std::string name;
    std::function<void()> run;
  };
  const std::vector<Row> rows = {
      {"copy of the weight (cudaMemcpy)",
       [&] { CHECK(cudaMemcpyAsync(dst, w, kWeightBytes, cudaMemcpyDeviceToDevice)); }},
      {"read pass: grid-stride, 4 blocks/SM", [&] { grid_stride<<<sms * 4, 256>>>(p, n); }},
      {"read pass: grid-stride, 8 blocks/SM (read_us)",
       [&] { grid_stride<<<sms * 8, 256>>>(p, n); }},
      {"read pass: grid-stride, 16 blocks/SM", [&] { grid_stride<<<sms * 16, 256>>>(p, n); }},
      {"read pass: grid-stride, one step per thread",
       [&] { grid_stride<<<unsigned(n / (256 * 4)), 256>>>(p, n); }},
      {"one step: 4 x 16 B per thread", [&] { one_step<4><<<n / (256 * 4), 256>>>(p); }},
      {"one step: 8 x 16 B per thread", [&] { one_step<8><<<n / (256 * 8), 256>>>(p); }},
      {"one step: 16 x 16 B per thread", [&] { one_step<16><<<n / (256 * 16), 256>>>(p); }},
      {"projection order: u1, 4 blocks/SM",
       [&] { projection_order<1, 4><<<kRows / 16, 256>>>(w); }},
      {"projection order: u2, 4 blocks/SM (m1s8u2)",
       [&] { projection_order<2, 4><<<kRows / 16, 256>>>(w); }},
      {"projection order: u2, 3 blocks/SM",
       [&] { projection_order<2, 3><<<kRows / 16, 256>>>(w); }},
      {"projection order: u4, 3 blocks/SM",
       [&] { projection_order<4, 3><<<kRows / 16, 256>>>(w); }},
      {"projection order: u8, 2 blocks/SM",
       [&] { projection_order<8, 2><<<kRows / 16, 256>>>(w); }},
      {"projection order: u2, hidden over 2 blocks",
       [&] { projection_order<2, 4, 2><<<kRows / 16 * 2, 256>>>(w); }},
      {"projection order: u2, hidden over 4 blocks",
       [&] { projection_order<2, 4, 4><<<kRows / 16 * 4, 256>>>(w); }},
      {"projection order: u1, hidden over 8 blocks",
       [&] { projection_order<1, 4, 8><<<kRows / 16 * 8, 256>>>(w); }},
      {"bulk: 2 stages of 8 KiB", bulk(bulk_ring<2, 8192>, 2 * 8192)},
      {"bulk: 4 stages of 8 KiB", bulk(bulk_ring<4, 8192>, 4 * 8192)},
      {"bulk: 3 stages of 16 KiB", bulk(bulk_ring<3, 16384>, 3 * 16384)},
      {"bulk: 4 stages of 16 KiB", bulk(bulk_ring<4, 16384>, 4 * 16384)},
      {"bulk: 2 stages of 32 KiB", bulk(bulk_ring<2, 32768>, 2 * 32768)},
  };
  std::vector<double> us[2];
  for (int round = 0; round < 2; ++round)
    for (const Row& r : rows) us[round].push_back(time(r.run));
  const double floor_us = std::min(us[0][0], us[1][0]) / 2;
  std::printf("copy floor (half the copy): %.2f us\n", floor_us);
  std::printf("%-48s %17s %13s %9s\n", "row", "us (two rounds)", "x floor", "GB/s");
  for (size_t i = 0; i < rows.size(); ++i) {
    const double lo = std::min(us[0][i], us[1][i]), hi = std::max(us[0][i], us[1][i]);
    const double moved = double(kWeightBytes) * (i == 0 ? 2 : 1);  // the copy also writes
    std::printf("%-48s %8.2f %8.2f %6.2f %6.2f %9.0f\n", rows[i].name.c_str(), us[0][i], us[1][i],
                lo / floor_us, hi / floor_us, moved / lo / 1e3);
  }
  return 0;
}
