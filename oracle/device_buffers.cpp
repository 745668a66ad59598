#include "oracle/device_buffers.hpp"

#include <string>
#include <utility>

#include "jit/driver.hpp"
#include "jit/errors.hpp"

namespace ropejit::oracle {

DeviceBuffers::~DeviceBuffers() {
  std::string why;
  const detail::Driver* d = detail::try_driver(&why);
  for (const auto& b : buffers_) {
    if (b->device && d) d->MemFree(b->device);
    if (b->initial && d) d->MemFree(b->initial);
  }
}

DeviceBuffers::Buffer& DeviceBuffers::add(std::vector<uint8_t> host, size_t guard, uint8_t poison) {
  host.resize(host.size() + guard, poison);
  buffers_.push_back(std::make_unique<Buffer>(Buffer{std::move(host), 0}));
  return *buffers_.back();
}

void DeviceBuffers::upload() {
  const detail::Driver& d = detail::driver();
  for (const auto& b : buffers_) {
    if (!b->device) detail::check(d.MemAlloc(&b->device, b->host.size()), "cuMemAlloc");
    detail::check(d.MemcpyHtoD(b->device, b->host.data(), b->host.size()), "cuMemcpyHtoD");
  }
}

std::vector<uint8_t> DeviceBuffers::download(const Buffer& b) {
  std::vector<uint8_t> got(b.host.size());
  detail::check(detail::driver().MemcpyDtoH(got.data(), b.device, got.size()), "cuMemcpyDtoH");
  return got;
}

int DeviceBuffers::index_of(const void* host) const {
  const uint8_t* p = static_cast<const uint8_t*>(host);
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const std::vector<uint8_t>& h = buffers_[i]->host;
    if (p >= h.data() && p < h.data() + h.size()) return int(i);
  }
  return -1;
}

void* DeviceBuffers::device_address(const void* host) const {
  if (!host) return nullptr;
  const int i = index_of(host);
  if (i < 0) detail::fail(ErrorCode::internal, "oracle: a pointer outside its buffers");
  const Buffer& b = *buffers_[size_t(i)];
  const auto offset = static_cast<const uint8_t*>(host) - b.host.data();
  return reinterpret_cast<void*>(static_cast<uintptr_t>(b.device + CUdeviceptr(offset)));
}

bool DeviceBuffers::keep_initial() {
  const detail::Driver& d = detail::driver();
  for (const auto& b : buffers_) {
    if (d.MemAlloc(&b->initial, b->host.size()) != CUDA_SUCCESS) {
      b->initial = 0;
      drop_initial();
      return false;
    }
    detail::check(d.MemcpyDtoDAsync(b->initial, b->device, b->host.size(), nullptr),
                  "cuMemcpyDtoDAsync");
  }
  return true;
}

void DeviceBuffers::restore_initial() {
  const detail::Driver& d = detail::driver();
  for (const auto& b : buffers_)
    detail::check(d.MemcpyDtoDAsync(b->device, b->initial, b->host.size(), nullptr),
                  "cuMemcpyDtoDAsync");
}

void DeviceBuffers::drop_initial() {
  std::string why;
  const detail::Driver* d = detail::try_driver(&why);
  for (const auto& b : buffers_)
    if (b->initial) {
      if (d) d->MemFree(b->initial);
      b->initial = 0;
    }
}

}  // namespace ropejit::oracle
