/* fuzz_vcf: libFuzzer harness for the record checks and window building of moe-score
 * variants (score_vcf_site.c), without a model: the input, a VCF/BCF (htslib sniffs plain,
 * bgzip or BCF) given as a "data:" URL (read from memory), is opened with its header
 * (score_vcf_sites_input) and every record read into sites (score_vcf_sites_next) against a
 * fixed reference (contigs chr1 of 300 bases and c2 of 40, with a .fai, written and opened
 * once) with the byte tokenizer, a context of 64 positions and 24-base windows: contig, POS
 * and REF checks, allele classification (symbolic, off a contig edge, REF mismatch), the
 * windows of both strands and their tokens. Bit 0 of the input's size picks --check-ref warn
 * (mismatches skipped) over the default (a mismatch is an error), bit 1 --rc-average (both
 * strands). Every scored ALT's windows are checked (tokens within the context, the shared
 * prefix within them); errors are expected, crashes, leaks and a broken window are findings.
 * fuzz_vcf_score runs the same inputs through moe_score_vcf_run with a model, much slower.
 *
 * The one thing to know: the fixture (reference, tokenizer, geometry, the open sites) is
 * made once per process (libFuzzer gives the callback no context), so it lives in
 * file-scope variables, freed and removed at exit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_fixture.h"
#include "moe/fileio.h"
#include "moe/input.h"
#include "moe/tokenizer.h"
#include "score/score_vcf.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_root[64];        /* the reference's directory (set once, by the initializer) */
static char g_fasta[96];       /* g_root/ref.fa */
static moe_tokenizer *g_tok;   /* the byte tokenizer */
static score_model g_sm;       /* its geometry only: no checkpoint, no model */
static moe_score_vcf_opts g_o; /* the options; .vcf and the flags set per input */
static vcf_sites g_s;          /* the reference open, an input at a time */

static void remove_fixture(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree(g_root, &err);
    score_vcf_sites_close(&g_s);
    moe_tokenizer_free(g_tok);
}

/* Makes the fixture (quiet: fuzz_quiet). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_vcf_fixture("fuzz_vcf", g_root, sizeof g_root, g_fasta, sizeof g_fasta);
    atexit(remove_fixture);
    moe_err err;
    moe_err_clear(&err);
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_BYTE);
    if (moe_tokenizer_create(&g_tok, &o, &err) != MOE_OK ||
        moe_input_check_rc(g_tok, &err) != MOE_OK)
        fuzz_fixture_fail(g_root, "the byte tokenizer", &err);
    score_model_geometry(&g_sm, g_tok, 64, 0);
    moe_score_vcf_opts_defaults(&g_o);
    g_o.fasta = g_fasta;
    g_o.window = 24;
    if (score_vcf_sites_open(&g_s, &g_o, &err) != MOE_OK ||
        score_vcf_sites_model(&g_s, &g_sm, &err) != MOE_OK)
        fuzz_fixture_fail(g_root, "the reference", &err);
    return 0;
}

/* Aborts unless every scored ALT of site st has windows within the context whose shared
 * prefix lies inside them (what score_vcf.c's LLR sums rely on). */
static void check_site(const vcf_sites *s, const vsite *st) {
    for (int a = 0; a < st->n_alt; a++) {
        if (st->status[a] != ALT_SCORED) continue;
        for (int r = 0; r < st->strands; r++) {
            const vwin *rw = &st->ref[r], *aw = &st->alt[2 * a + r];
            if (!rw->ids || !aw->ids || rw->n > s->sm->max_content || aw->n > s->sm->max_content ||
                aw->from < s->sm->first || aw->from > aw->n)
                abort();
        }
    }
}

/* data [size] bytes: one VCF/BCF file. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *url = fuzz_data_url(data, size);
    g_o.vcf = url;
    g_o.check_ref_warn = (int)(size & 1);
    g_o.m.rc_average = (int)(size >> 1 & 1);
    moe_err err;
    moe_err_clear(&err);
    if (score_vcf_sites_input(&g_s, &err) == MOE_OK) {
        while (score_vcf_sites_next(&g_s, &err) == 1) {
            check_site(&g_s, &g_s.sites[g_s.n_sites - 1]);
            if (g_s.n_sites >= 8) score_vcf_sites_clear(&g_s); /* a chunk, as the scorer's */
        }
    }
    score_vcf_sites_end(&g_s);
    free(url);
    return 0;
}
