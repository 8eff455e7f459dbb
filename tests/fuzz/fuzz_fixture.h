/* fuzz_fixture: what the harnesses share - where their scratch files go (fuzz_tmpdir), an
 * input as an htslib "data:" URL (fuzz_data_url: the readers that open paths then parse it
 * from memory), silence (fuzz_quiet), the VCF harnesses' directory and reference
 * (fuzz_vcf_fixture, fuzz_write_reference), and for those that need a checkpoint directory
 * the config of a tiny model (1 layer, hidden 16, 2 experts, byte vocabulary, context 64)
 * that fuzz_ckpt_dir writes as config.yaml and fuzz_vcf_score trains nothing with (random
 * weights). *
 * The one thing to know: tests/fuzz/corpus/ckpt's MANIFEST seeds carry the CRC32 of exactly
 * this text as config.yaml; change it and regenerate them, or they stop matching. */
#ifndef MOE_FUZZ_FIXTURE_H
#define MOE_FUZZ_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <htslib/faidx.h>
#include <htslib/hts.h>

#include "moe/err.h"
#include "moe/fileio.h"
#include "moe/log.h"

/* $TMPDIR, else /tmp (also when $TMPDIR is longer than the harnesses' path buffers allow,
 * 32 bytes): run.sh points it at a directory it removes when the run ends, so the files of
 * a harness that crashed are not left behind. */
static inline const char *fuzz_tmpdir(void) {
    const char *t = getenv("TMPDIR");
    return t && *t && strlen(t) <= 32 ? t : "/tmp";
}

/* data [size] bytes as a "data:," URL (malloc'ed; aborts when out of memory): htslib's hopen
 * reads it from memory (hfile.c's built-in data scheme), so moe_seqio_open and hts_open
 * take it where they take a path. Every byte stands for itself but '%' and NUL, written %25
 * and %00 (percent decoding; the URL is a C string). */
static inline char *fuzz_data_url(const void *data, size_t size) {
    const unsigned char *p = data, *end = p + size;
    char *url = malloc(6 + 3 * size + 1), *q = url;
    if (!url) abort();
    memcpy(q, "data:,", 6);
    q += 6;
    while (p < end) { /* runs between the bytes to escape, copied whole: fast */
        const unsigned char *pct = memchr(p, '%', (size_t)(end - p));
        const unsigned char *nul = memchr(p, '\0', (size_t)((pct ? pct : end) - p));
        const unsigned char *stop = nul ? nul : pct ? pct : end;
        memcpy(q, p, (size_t)(stop - p));
        q += stop - p;
        if (stop == end) break;
        *q++ = '%';
        *q++ = *stop ? '2' : '0';
        *q++ = *stop ? '5' : '0';
        p = stop + 1;
    }
    *q = '\0';
    return url;
}

/* Silences messages below errors (as prog) and all of htslib's: a warning per input is
 * noise, and writing it costs more than the input. */
static inline void fuzz_quiet(const char *prog) {
    moe_log_init(prog, MOE_LOG_ERROR);
    hts_set_log_level(HTS_LOG_OFF);
}

/* A fixture in dir could not be made: says what (and err's message, if any) and aborts. */
static inline void fuzz_fixture_fail(const char *dir, const char *what, const moe_err *err) {
    fprintf(stderr, "cannot make the fuzz fixture in %s: %s: %s\n", dir, what,
            err && err->msg[0] ? err->msg : "failed");
    abort();
}

/* The reference of the VCF harnesses at path, with its .fai: chr1, 300 pseudo-random bases in
 * lines of 60, and c2, 40 bases (corpus/vcf's seeds are written against it). Returns 0, or
 * -1 when it could not be written. */
static inline int fuzz_write_reference(const char *path) {
    FILE *fp = fopen(path, "w");
    if (!fp) return -1;
    uint32_t x = 12345;
    const int len[2] = {300, 40};
    for (int c = 0; c < 2; c++) {
        fprintf(fp, ">%s\n", c ? "c2" : "chr1");
        for (int i = 0; i < len[c]; i++) {
            x = x * 1664525u + 1013904223u;
            fputc("ACGT"[x >> 30], fp);
            if (i % 60 == 59 || i == len[c] - 1) fputc('\n', fp);
        }
    }
    return fclose(fp) != 0 || fai_build(path) != 0 ? -1 : 0;
}

/* The start of the VCF harnesses: fuzz_quiet(prog), then dir [dir_n] =
 * $TMPDIR/moe-fuzz-vcf.PID made, holding the reference fasta [fasta_n] = dir/ref.fa
 * (fuzz_write_reference). Aborts on failure. */
static inline void fuzz_vcf_fixture(const char *prog, char *dir, size_t dir_n, char *fasta,
                                    size_t fasta_n) {
    fuzz_quiet(prog);
    snprintf(dir, dir_n, "%s/moe-fuzz-vcf.%ld", fuzz_tmpdir(), (long)getpid());
    snprintf(fasta, fasta_n, "%s/ref.fa", dir);
    moe_err err;
    moe_err_clear(&err);
    if (moe_mkdirs(dir, &err) != MOE_OK) fuzz_fixture_fail(dir, "the directory", &err);
    if (fuzz_write_reference(fasta) != 0) fuzz_fixture_fail(dir, "ref.fa and its .fai", NULL);
}

#define FUZZ_FIXTURE_CONFIG                                                                        \
    "model:\n  vocab_size: 256\n  hidden_size: 16\n  intermediate_size: 16\n"                      \
    "  num_hidden_layers: 1\n  num_attention_heads: 2\n  num_key_value_heads: 1\n"                 \
    "  num_local_experts: 2\n  num_experts_per_tok: 1\n  max_position_embeddings: 64\n"            \
    "train:\n  steps: 1\n  seq_len: 16\n  global_batch_tokens: 16\noptim:\n  warmup_steps: 0\n"

#endif
