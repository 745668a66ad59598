/* A program written against ropejit 0.1.0's header (ropejit_v0.1.0.h, as released), linked with
 * today's library: its structs have no header member, and the library must read only what they
 * hold. Each struct sits at the end of a page whose successor is unmapped, so a read past it
 * crashes. Prints what failed; exit status 0 when everything held. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ropejit_v0.1.0.h"

static int failures = 0;

static void expect(int ok, const char* what, const char* detail) {
  if (!ok) {
    printf("FAILED: %s (%s)\n", what, detail);
    ++failures;
  }
}

/* `size` bytes that end where an unmapped page begins. */
static void* at_page_end(size_t size) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char* two = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
  if (two == MAP_FAILED || mprotect(two + page, page, PROT_NONE) != 0) return NULL;
  return two + page - size;
}

int main(void) {
  ropejit_spec* spec = at_page_end(sizeof *spec);
  ropejit_args* args = at_page_end(sizeof *args);
  char key[256];
  if (!spec || !args) {
    printf("FAILED: mmap\n");
    return 1;
  }
  ropejit_spec_init(spec);
  expect(ropejit_key(spec, key, sizeof key) == ROPEJIT_OK, "key of the defaults", ropejit_last_error());
  expect(strcmp(key, "rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip") == 0,
         "the default key", key);
  spec->layout = ROPEJIT_LAYOUT_THD;
  spec->style = ROPEJIT_GPTJ;
  spec->positions = ROPEJIT_POS_IDS;
  spec->index_type = ROPEJIT_I32;
  spec->freqs = ROPEJIT_FREQS_COMPUTED;
  spec->in_place = 0;
  expect(ropejit_key(spec, key, sizeof key) == ROPEJIT_OK, "key of a set spec", ropejit_last_error());
  expect(strcmp(key, "rope_thd_bf16_d128_r128_gptj_pos-ids-i32_comp_qk_fwd_oop") == 0,
         "the set key", key);

  spec->head_dim = 7;
  expect(ropejit_key(spec, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT, "odd head_dim",
         ropejit_last_error());
  expect(strcmp(ropejit_last_error(), "ropejit: spec.head_dim (7) must be even and in [2, 512]") == 0,
         "its message", ropejit_last_error());

  ropejit_spec_init(spec);
  ropejit_args_init(args);
  args->seq_len = 3;
  expect(ropejit_apply(spec, args) == ROPEJIT_ERROR_INVALID_ARGUMENT, "apply without q",
         ropejit_last_error());
  expect(strcmp(ropejit_last_error(), "ropejit: args.q.heads (0) must be in [1, 2^29]") == 0,
         "its message", ropejit_last_error());
  expect(ropejit_precompile(spec, "volta") == ROPEJIT_ERROR_INVALID_ARGUMENT, "a bad arch",
         ropejit_last_error());
  printf("%s: %d failure(s)\n", ropejit_version(), failures);
  return failures == 0 ? 0 : 1;
}
