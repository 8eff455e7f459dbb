/* fuzz_fixture: what the harnesses share - where their scratch files go (fuzz_tmpdir), and
 * for those that need a checkpoint directory the config of a tiny model (1 layer, hidden 16,
 * 2 experts, byte vocabulary, context 64) that fuzz_ckpt writes as config.yaml and fuzz_vcf
 * trains nothing with (random weights).
 *
 * The one thing to know: tests/fuzz/corpus/ckpt's MANIFEST seeds carry the CRC32 of exactly
 * this text as config.yaml; change it and regenerate them, or they stop matching. */
#ifndef MOE_FUZZ_FIXTURE_H
#define MOE_FUZZ_FIXTURE_H

#include <stdlib.h>
#include <string.h>

/* $TMPDIR, else /tmp (also when $TMPDIR is longer than the harnesses' path buffers allow,
 * 32 bytes): run.sh points it at a directory it removes when the run ends, so the files of
 * a harness that crashed are not left behind. */
static inline const char *fuzz_tmpdir(void) {
    const char *t = getenv("TMPDIR");
    return t && *t && strlen(t) <= 32 ? t : "/tmp";
}

#define FUZZ_FIXTURE_CONFIG                                                                        \
    "model:\n  vocab_size: 256\n  hidden_size: 16\n  intermediate_size: 16\n"                      \
    "  num_hidden_layers: 1\n  num_attention_heads: 2\n  num_key_value_heads: 1\n"                 \
    "  num_local_experts: 2\n  num_experts_per_tok: 1\n  max_position_embeddings: 64\n"            \
    "train:\n  steps: 1\n  seq_len: 16\n  global_batch_tokens: 16\noptim:\n  warmup_steps: 0\n"

#endif
