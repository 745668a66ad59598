// libFuzzer target: the C API as a binding calls it. Input bytes become the caller's structs,
// each in a heap block of exactly the size its header claims (or 0.1.0's headerless size), with
// longrope factor arrays of exactly factor_count values: ASan reports any read past what the
// caller handed over. Every call returns a status; none crashes. Without a driver, a call that
// passes its checks stops at no_driver; nothing is compiled (precompile is not called).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ropejit/ropejit.h"

namespace {

struct Input {
  const uint8_t* data;
  size_t size;
  uint8_t byte() {
    if (size == 0) return 0;
    --size;
    return *data++;
  }
  // Fills `n` bytes from the input (zeros once it runs out).
  void fill(void* out, size_t n) {
    const size_t k = n < size ? n : size;
    std::memcpy(out, data, k);
    std::memset(static_cast<uint8_t*>(out) + k, 0, n - k);
    data += k;
    size -= k;
  }
};

// A block of exactly `bytes` holding a T the way a caller of another header version would pass
// it: the library's defaults from its _init (when `sized`), then fuzzed fields over them.
template <class T, class Init>
std::unique_ptr<uint8_t[]> make(Input& in, Init init, size_t* bytes) {
  const uint8_t how = in.byte() % 4;
  // 0: this header; 1: a smaller or larger claimed size; 2: garbage header; 3: all fuzzed.
  size_t n = sizeof(T);
  if (how == 1) n = sizeof(ropejit_header) + in.byte() * 4u;
  auto block = std::make_unique<uint8_t[]>(n);
  std::memset(block.get(), 0, n);
  if (how == 0 || how == 1) {
    T full{};
    init(&full, sizeof full);
    std::memcpy(block.get(), &full, n < sizeof full ? n : sizeof full);
    ropejit_header h{uint32_t(n), ROPEJIT_STRUCT_TAG};
    std::memcpy(block.get(), &h, sizeof h);
    // Overwrite a fuzzed slice of the fields, leaving the header.
    const size_t at = sizeof h + in.byte() % (n > sizeof h ? n - sizeof h : 1);
    const size_t len = in.byte();
    if (at < n) in.fill(block.get() + at, len < n - at ? len : n - at);
  } else {
    in.fill(block.get(), n);
  }
  *bytes = n;
  return block;
}

// Points a scaling's factor arrays at blocks of exactly factor_count values (kept in `keep`).
void own_factors(ropejit_scaling* s, std::vector<std::unique_ptr<double[]>>* keep) {
  const int64_t count = s->factor_count;
  if (count < 0 || count > 4096) {
    s->short_factor = s->long_factor = nullptr;
    return;
  }
  for (const double** p : {&s->short_factor, &s->long_factor}) {
    keep->emplace_back(new double[size_t(count) + 1]);  // new double[0] is not a usable array
    for (int64_t i = 0; i < count; ++i) keep->back()[size_t(i)] = 1.0 + 0.01 * double(i);
    *p = count > 0 ? keep->back().get() : nullptr;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  std::vector<std::unique_ptr<double[]>> keep;
  char key[512];
  size_t n = 0;
  switch (in.byte() % 6) {
    case 0: {  // a key from a spec of any header version
      auto spec = make<ropejit_spec>(in, ropejit_spec_init_sized, &n);
      (void)ropejit_key(reinterpret_cast<ropejit_spec*>(spec.get()), key, sizeof key);
      break;
    }
    case 1: {  // a call's checks; the 0.1.0 layout when the spec has no header
      auto spec = make<ropejit_spec>(in, ropejit_spec_init_sized, &n);
      ropejit_header h;
      std::memcpy(&h, spec.get(), sizeof h);
      std::unique_ptr<uint8_t[]> args;
      if (h.tag != ROPEJIT_STRUCT_TAG) {
        // 0.1.0's args: the fields before today's scaling, without the header.
        const size_t v010 = offsetof(ropejit_args, scaling) - sizeof(ropejit_header);
        args = std::make_unique<uint8_t[]>(v010);
        in.fill(args.get(), v010);
      } else {
        size_t args_bytes = 0;
        args = make<ropejit_args>(in, ropejit_args_init_sized, &args_bytes);
        if (args_bytes >= sizeof(ropejit_args))
          own_factors(&reinterpret_cast<ropejit_args*>(args.get())->scaling, &keep);
        else if (args_bytes > offsetof(ropejit_args, scaling))
          break;  // fuzzed factor pointers in a short block: no caller's layout has those
      }
      (void)ropejit_apply(reinterpret_cast<ropejit_spec*>(spec.get()),
                          reinterpret_cast<ropejit_args*>(args.get()));
      break;
    }
    case 2: {  // frequencies of a table spec
      auto table = make<ropejit_table_spec>(in, ropejit_table_spec_init_sized, &n);
      if (n < sizeof(ropejit_table_spec)) break;
      auto* t = reinterpret_cast<ropejit_table_spec*>(table.get());
      own_factors(&t->scaling, &keep);
      const size_t count = size_t(in.byte()) * 4;
      std::vector<double> out(count + 1);
      (void)ropejit_inverse_frequencies(t, int32_t(in.byte()) * 2, out.data(), count);
      double af = 0;
      (void)ropejit_attention_factor(t, int32_t(in.byte()) * 2, &af);
      break;
    }
    case 3: {  // the projection's workspace and path (arithmetic on the struct only)
      auto spec = make<ropejit_qkv_proj_spec>(in, ropejit_qkv_proj_spec_init_sized, &n);
      size_t args_bytes = 0;
      auto args = make<ropejit_qkv_proj_args>(in, ropejit_qkv_proj_args_init_sized, &args_bytes);
      size_t bytes = 0;
      int32_t path = 0;
      auto* s = reinterpret_cast<ropejit_qkv_proj_spec*>(spec.get());
      auto* a = reinterpret_cast<ropejit_qkv_proj_args*>(args.get());
      (void)ropejit_qkv_projection_workspace_bytes(s, a, &bytes);
      (void)ropejit_qkv_projection_path(s, a, &path);
      (void)ropejit_qkv_proj_key(s, key, sizeof key);
      break;
    }
    case 4: {  // the FFN's
      auto spec = make<ropejit_ffn_spec>(in, ropejit_ffn_spec_init_sized, &n);
      size_t args_bytes = 0;
      auto args = make<ropejit_ffn_args>(in, ropejit_ffn_args_init_sized, &args_bytes);
      size_t bytes = 0;
      int32_t path = 0;
      auto* s = reinterpret_cast<ropejit_ffn_spec*>(spec.get());
      auto* a = reinterpret_cast<ropejit_ffn_args*>(args.get());
      (void)ropejit_ffn_gate_up_workspace_bytes(s, a, &bytes);
      (void)ropejit_ffn_gate_up_path(s, a, &path);
      (void)ropejit_ffn_key(s, key, sizeof key);
      break;
    }
    default: {  // the config reader's text API into output structs of any claimed size
      size_t model_bytes = 0;
      auto spec = make<ropejit_spec>(in, ropejit_spec_init_sized, &n);
      auto model = make<ropejit_model>(in, ropejit_model_init_sized, &model_bytes);
      const std::string text(reinterpret_cast<const char*>(in.data), in.size);
      (void)ropejit_spec_from_hf_config_text(text.c_str(), ROPEJIT_BF16,
                                             reinterpret_cast<ropejit_spec*>(spec.get()),
                                             reinterpret_cast<ropejit_model*>(model.get()));
      break;
    }
  }
  (void)ropejit_last_error();
  return 0;
}
