// Binds a spec and a kernel variant into templates/rope_entry.cu.in.
#include "jit/render.hpp"

#include <map>

#include "jit/call.hpp"
#include "jit/embedded.hpp"
#include "jit/errors.hpp"

namespace ropejit::detail {

std::string substitute_template(const std::string& text,
                                const std::map<std::string, std::string>& vars) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find("{{", pos);
    if (open == std::string::npos) break;
    const size_t close = text.find("}}", open);
    if (close == std::string::npos) fail(ErrorCode::internal, "unterminated {{ in entry template");
    const std::string name = text.substr(open + 2, close - open - 2);
    const auto it = vars.find(name);
    if (it == vars.end())
      fail(ErrorCode::internal, "entry template variable {{", name, "}} is unbound");
    out.append(text, pos, open - pos);
    out += it->second;
    pos = close + 2;
  }
  out.append(text, pos, std::string::npos);
  return out;
}

RenderedKernel render_entry(const std::string& key, const std::string& variant,
                            const char* entry_file, std::map<std::string, std::string> vars) {
  RenderedKernel r;
  r.key = key;
  r.entry = entry_name(key, variant);
  vars["key"] = key;
  vars["variant"] = variant;
  vars["entry"] = r.entry;
  r.source = substitute_template(embedded_file(entry_file), vars);
  return r;
}

std::string entry_name(const std::string& key, const std::string& variant_name) {
  std::string out = key;
  for (char& ch : out)
    if (ch == '-') ch = 'Z';
  return out + "__" + variant_name;
}

RenderedKernel render(const Spec& c, const KernelVariant& v) {
  const char* params = c.fused() ? "FusedParams" : "RopeParams";
  return render_entry(
      c.key(), v.name(), "rope_entry.cu.in",
      {
          {"dtype", std::to_string(int(c.dtype))},
          {"head_dim", std::to_string(c.head_dim)},
          {"rotary_dim", std::to_string(c.rotary_dim)},
          {"neox", flag(c.style == Style::neox)},
          {"packed", flag(c.layout == Layout::thd)},
          {"seq_major", flag(c.layout == Layout::sbhd)},
          {"pos_mode", std::to_string(int(c.positions))},
          {"idx64", flag(c.index_type == IndexType::i64)},
          {"computed", flag(c.freqs != Freqs::table)},
          {"table_dtype", std::to_string(int(c.table_dtype))},
          {"table_full", flag(c.table_width == TableWidth::full)},
          {"backward", flag(c.direction == Direction::backward)},
          {"in_place", flag(c.in_place)},
          {"vec", std::to_string(v.vec)},
          {"heads_per_thread", std::to_string(v.heads_per_thread)},
          {"max_threads", std::to_string(v.max_threads)},
          // Fused kernels of up to 256 threads keep two blocks per SM (at most 128 registers): one
          // block per SM leaves a prefill too few bytes in flight.
          {"min_blocks", c.fused() && v.max_threads <= 256 ? "2" : "1"},
          {"table_vec", flag(v.table_vec)},
          {"grid_stride", flag(v.grid_stride)},
          {"narrow", flag(v.narrow)},
          {"ring", std::to_string(v.ring)},
          {"lanes", std::to_string(chunks(c, v.vec))},
          {"header", c.fused() ? "rope_fused.cuh" : "rope_kernel.cuh"},
          {"kernel", c.fused() ? "FusedKernel" : "RopeKernel"},
          {"param_block", needs_pair_table(c) ? concat("ropejit_dev::WithPairs<ropejit_dev::",
                                                       params, ", ", c.rotary_dim / 2, ">")
                                              : concat("ropejit_dev::", params)},
          {"param_base", needs_pair_table(c) ? "p.base" : "p"},
          {"param_pairs", needs_pair_table(c) ? "&p.pairs" : "nullptr"},
          {"pair_table", flag(scaled_freqs(c))},
          {"norm", std::to_string(int(c.norm))},
          {"cache", std::to_string(int(c.cache))},
          {"need_sequence", flag(c.cache == KvCache::paged || c.cache == KvCache::contiguous)},
          {"out_e4m3", flag(is_fp8(c.out_store))},
          {"out_dynamic", flag(c.out_store == Store::e4m3_dynamic)},
          {"cache_e4m3", flag(is_fp8(c.cache_store))},
          {"cache_dynamic", flag(c.cache_store == Store::e4m3_dynamic)},
          {"write_k", flag(c.fusion == Fusion::qk)},
      });
}

}  // namespace ropejit::detail
