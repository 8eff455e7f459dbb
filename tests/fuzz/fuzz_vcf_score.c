/* fuzz_vcf_score: libFuzzer harness for the VCF path of moe-score end to end
 * (moe_score_vcf_run, score_vcf.c and score_vcf_out.c, with a model forward per input);
 * fuzz_vcf runs the record checks and window building alone, much faster, on the same inputs
 * (seeds: corpus/vcf). The input is written to a temporary VCF (htslib sniffs plain, bgzip or BCF)
 * and scored end to end against a fixed reference (contigs chr1 of 300 bases and c2 of 40,
 * with a .fai) with a fixed tiny checkpoint (random weights, byte tokenizer) and 24-base
 * windows (the output VCF goes to /dev/null). Every record goes through the checks against the
 * reference (contig, REF match, window edges, symbolic ALTs), the window building and the
 * tokenizer; an odd-sized input runs with --check-ref warn (mismatches skipped), an even one
 * with the default (a mismatch is an error). Errors are expected; crashes and leaks are
 * findings.
 *
 * The one thing to know: the fixture (reference, checkpoint) is made once per process
 * (libFuzzer gives the callback no context), so its directory lives in one file-scope
 * buffer, and it is removed at exit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_fixture.h"
#include "moe/ckpt.h"
#include "moe/config.h"
#include "moe/fileio.h"
#include "moe/model.h"
#include "moe/score.h"
#include "moe/tokenizer.h"
#include "moe/train.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_root[64]; /* the fixture directory (set once, by the initializer) */

static void remove_fixture(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree(g_root, &err);
}

/* g_root/run/ckpt-00000001: the model of FUZZ_FIXTURE_CONFIG with random weights, zero Adam
 * moments. */
static void make_checkpoint(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_config cfg;
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_BYTE);
    moe_tokenizer *tok = NULL;
    moe_model model;
    memset(&model, 0, sizeof model);
    const moe_backend *be = moe_backend_cpu();
    if (moe_config_load_string(&cfg, FUZZ_FIXTURE_CONFIG, "fuzz.yaml", &err) != MOE_OK ||
        moe_tokenizer_create(&tok, &o, &err) != MOE_OK ||
        moe_model_create(&model, &cfg.model, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, be, 1, 16,
                         &err) != MOE_OK)
        fuzz_fixture_fail(g_root, "the model", &err);
    moe_model_init_weights(&model, 7);
    float *zero = calloc((size_t)model.table.n_elems, sizeof *zero);
    moe_trainer_state ts;
    memset(&ts, 0, sizeof ts);
    ts.step = 1;
    ts.seed = 1;
    char run[96];
    snprintf(run, sizeof run, "%s/run", g_root);
    if (!zero ||
        moe_train_save_checkpoint(run, 1, &cfg, moe_tokenizer_spec_json(tok), &model,
                                  moe_cbuf_f32(zero), moe_cbuf_f32(zero), &ts, &err) != MOE_OK)
        fuzz_fixture_fail(g_root, "the checkpoint", &err);
    free(zero);
    moe_model_free(&model);
    moe_tokenizer_free(tok);
}

/* Makes the fixture (quiet: fuzz_quiet). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char fasta[96];
    fuzz_vcf_fixture("fuzz_vcf_score", g_root, sizeof g_root, fasta, sizeof fasta);
    atexit(remove_fixture);
    make_checkpoint();
    /* the output goes through a link to /dev/null: written in place, no fsync per input (a
     * link, as the e2e tests do, so that a regression of the output helper replaces the link,
     * never the device) */
    char out[96];
    snprintf(out, sizeof out, "%s/out.vcf", g_root);
    if (symlink("/dev/null", out) != 0) fuzz_fixture_fail(g_root, out, NULL);
    return 0;
}

/* data [size] bytes: one VCF/BCF file. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char vcf[96], fasta[96], run[96], out[96];
    snprintf(vcf, sizeof vcf, "%s/in.vcf", g_root);
    snprintf(fasta, sizeof fasta, "%s/ref.fa", g_root);
    snprintf(run, sizeof run, "%s/run", g_root);
    snprintf(out, sizeof out, "%s/out.vcf", g_root);
    FILE *fp = fopen(vcf, "wb");
    if (!fp || (size && fwrite(data, 1, size, fp) != size) || fclose(fp) != 0) abort();
    moe_score_vcf_opts o;
    moe_score_vcf_opts_defaults(&o);
    o.m.ckpt_dir = run;
    o.m.device = MOE_DEVICE_CPU;
    o.m.threads = 1;
    o.m.quiet = 1;
    o.m.batch_tokens = 128; /* the buffers of 8192 tokens cost more than a whole input */
    o.fasta = fasta;
    o.vcf = vcf;
    o.output = out;
    o.window = 24;
    o.check_ref_warn = (int)(size & 1);
    moe_err err;
    moe_err_clear(&err);
    moe_score_summary sum;
    (void)moe_score_vcf_run(&o, &sum, &err);
    return 0;
}
