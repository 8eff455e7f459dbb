/* score_vcf_site: the sites of `moe-score variants` (score_vcf.h) - the VCF/BCF and the
 * reference FASTA opened, each record read, checked against the reference (contig, POS, REF,
 * the window within the contig; symbolic ALTs) and turned into its REF and ALT windows of
 * both strands, tokenized. Windows (docs/cli.md): W bases, the REF window [s, s + W) with
 * s = POS0 - W/2 (POS0 = the 0-based position of the REF allele's first base), or with
 * --window-grid the multiple of W/2 with POS0 - s in [W/4, 3W/4); the ALT window
 * keeps the left flank [s, POS0), then the ALT allele, then the reference after the REF
 * allele, filled (a deletion) or trimmed (an insertion) on the right to W bases. Both are
 * tokenized as they are (FASTA case kept, the ALT as written in the VCF).
 *
 * The one thing to know: an ALT window's `from` is its first token that differs from the
 * REF window's (at least the first scorable one): a causal model gives the shared tokens
 * identical log-probabilities, so score_vcf.c scores only what follows. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/seqio.h"
#include "score/score_vcf.h"

/* ---- reference and input ---- */

/* The FASTA through faidx (never building an index beside the user's file). */
static moe_status open_fasta(vcf_sites *v, const char *path, moe_err *err) {
    v->fai = fai_load3(path, NULL, NULL, 0);
    if (v->fai) return MOE_OK;
    FILE *fp = fopen(path, "rb");
    if (!fp) return moe_err_errno(err, path, "cannot open the reference FASTA");
    unsigned char magic[2] = {0, 0};
    int gz = fread(magic, 1, 2, fp) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    fclose(fp);
    moe_err_set(err, MOE_ERR_INPUT, path, "cannot load the FASTA index (%s.fai%s)", path,
                gz ? " and .gzi" : "");
    if (gz)
        moe_err_hint(err,
                     "a gzip FASTA needs bgzip compression and an index: zcat %s | bgzip > "
                     "ref.fa.gz && samtools faidx ref.fa.gz (or decompress it and run "
                     "samtools faidx)",
                     path);
    else
        moe_err_hint(err, "index it first: samtools faidx %s", path);
    return MOE_ERR_INPUT;
}

/* A contig the FASTA lacks: an error naming the record, with a hint when only a chr prefix
 * differs. */
static moe_status missing_contig(vcf_sites *v, const char *chrom, int64_t pos, moe_err *err) {
    moe_err_set(err, MOE_ERR_INPUT, v->o->vcf,
                "%s:%" PRId64 ": contig '%s' is not in the reference %s", chrom, pos, chrom,
                v->o->fasta);
    moe_err_at_record(err, v->rec_no);
    char alt[1024];
    if (strncmp(chrom, "chr", 3) == 0)
        snprintf(alt, sizeof alt, "%s", chrom + 3);
    else
        snprintf(alt, sizeof alt, "chr%s", chrom);
    if (faidx_has_seq(v->fai, alt))
        moe_err_hint(err,
                     "the FASTA calls it '%s': the names differ by a chr prefix (rename "
                     "the VCF's contigs with bcftools annotate --rename-chrs)",
                     alt);
    else
        moe_err_hint(err, "use the reference the calls were made against");
    return MOE_ERR_INPUT;
}

/* <DEL>-style, * (a spanning deletion), . (no ALT) and breakends: nothing to score. */
static int is_symbolic(const char *a) {
    return a[0] == '<' || strcmp(a, "*") == 0 || strcmp(a, ".") == 0 || strchr(a, '[') ||
           strchr(a, ']');
}

/* Tokens of bases[0, len) into a new array (*ids, *n). */
static moe_status tokenize(vcf_sites *v, const char *bases, int64_t len, int32_t **ids, int64_t *n,
                           moe_err *err) {
    v->enc.n = 0;
    if (moe_tokenizer_encode(v->sm->tok, bases, len, &v->enc, err) != MOE_OK) return err->status;
    *ids = malloc((size_t)(v->enc.n ? v->enc.n : 1) * sizeof(int32_t));
    if (!*ids) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    memcpy(*ids, v->enc.ids, (size_t)v->enc.n * sizeof(int32_t));
    *n = v->enc.n;
    if (*n <= v->sm->max_content) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "a window of %" PRId64 " bases is %" PRId64 " tokens, more than the model's "
                "context of %" PRId64,
                len, *n, v->sm->max_content);
    moe_err_hint(err, "use a smaller --window");
    return MOE_ERR_INPUT;
}

/* The start of the REF window of a variant whose REF allele starts at pos0 (0-based): pos0 -
 * W/2, or on the grid of W/2 (--window-grid) the one whose middle half [W/4, W/4 + W/2) holds
 * pos0 (floor division: before the contig for pos0 < W/4). */
static int64_t window_start(const vcf_sites *v, int64_t pos0) {
    int64_t W = v->W, S = W / 2, x = pos0 - W / 4;
    if (!v->o->window_grid) return pos0 - W / 2;
    return (x >= 0 ? x / S : -((-x + S - 1) / S)) * S;
}

/* The REF and ALT windows of both strands of a site from the reference ref[0, len) that
 * starts at the window start; the variant's first base at offset h. */
static moe_status site_windows(vcf_sites *v, vsite *st, const char *ref, int64_t len, int64_t rlen,
                               int64_t h, moe_err *err) {
    int64_t W = v->W;
    if (score_grow((void **)&v->buf, &v->cap_buf, W + 1, 1, err) != MOE_OK) return err->status;
    for (int r = 0; r < st->strands; r++) {
        memcpy(v->buf, ref, (size_t)W);
        if (r) moe_seqio_revcomp(v->buf, W);
        if (tokenize(v, v->buf, W, &st->ref[r].ids, &st->ref[r].n, err) != MOE_OK)
            return err->status;
    }
    for (int a = 0; a < st->n_alt; a++) {
        if (st->status[a] != ALT_SCORED) continue;
        const char *alt = st->rec->d.allele[a + 1];
        int64_t alen = (int64_t)strlen(alt), right = W - h - alen;
        if (h + rlen + (right > 0 ? right : 0) > len) { /* the fill runs off the contig */
            st->status[a] = ALT_EDGE;
            continue;
        }
        memcpy(v->buf, ref, (size_t)h);
        memcpy(v->buf + h, alt, (size_t)(alen < W - h ? alen : W - h));
        if (right > 0) memcpy(v->buf + h + alen, ref + h + rlen, (size_t)right);
        for (int r = 0; r < st->strands; r++) {
            if (r) moe_seqio_revcomp(v->buf, W); /* the strand after the forward one */
            vwin *w = &st->alt[2 * a + r];
            if (tokenize(v, v->buf, W, &w->ids, &w->n, err) != MOE_OK) {
                moe_err_prefix(err, "ALT %d (%s)", a + 1, alt);
                return err->status;
            }
            const vwin *rw = &st->ref[r];
            int64_t p = 0;
            while (p < w->n && p < rw->n && w->ids[p] == rw->ids[p])
                p++;
            w->from = p > v->sm->first ? p : v->sm->first;
        }
    }
    return MOE_OK;
}

/* Reads the record into a new site: checks, windows, tokens. */
static moe_status add_site(vcf_sites *v, bcf1_t *rec, moe_err *err) {
    if (bcf_unpack(rec, BCF_UN_STR) < 0)
        return moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "record %" PRId64 " cannot be parsed",
                           v->rec_no);
    if (rec->n_allele < 1) { /* htslib leaves a line it could not split without alleles */
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "no REF allele");
        moe_err_at_record(err, v->rec_no);
        moe_err_hint(err, "the record is malformed: check its columns (tab-separated, no NUL "
                          "bytes)");
        return MOE_ERR_INPUT;
    }
    if (score_grow((void **)&v->sites, &v->cap_sites, v->n_sites + 1, sizeof *v->sites, err) !=
        MOE_OK)
        return err->status;
    vsite *st = &v->sites[v->n_sites++]; /* owned by the chunk from here */
    memset(st, 0, sizeof *st);
    st->rec = bcf_dup(rec);
    st->n_alt = rec->n_allele - 1;
    st->strands = v->o->m.rc_average ? 2 : 1;
    int n = st->n_alt > 0 ? st->n_alt : 1;
    st->status = calloc((size_t)n, sizeof *st->status);
    st->alt = calloc((size_t)n * 2, sizeof *st->alt);
    st->llr = malloc((size_t)n * sizeof *st->llr);
    if (!st->rec || !st->status || !st->alt || !st->llr)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    if (bcf_unpack(st->rec, BCF_UN_STR) < 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot copy record %" PRId64, v->rec_no);
    v->sum.records++;
    v->sum.alts += st->n_alt;
    for (int a = 0; a < st->n_alt; a++) {
        st->llr[a] = NAN;
        if (is_symbolic(rec->d.allele[a + 1])) st->status[a] = ALT_SYMBOLIC;
    }
    const char *chrom = bcf_seqname_safe(v->hdr, rec), *ref_allele = rec->d.allele[0];
    int64_t pos0 = rec->pos, rlen = (int64_t)strlen(ref_allele), W = v->W;
    int64_t s = window_start(v, pos0);
    st->start = s;
    if (!faidx_has_seq(v->fai, chrom)) return missing_contig(v, chrom, pos0 + 1, err);
    if (pos0 < 0) { /* POS 0 or empty (htslib reads both as 0): nothing to compare REF with */
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "%s: POS %" PRId64 " is not a position", chrom,
                    pos0 + 1);
        moe_err_at_record(err, v->rec_no);
        moe_err_hint(err, "VCF positions count from 1; the record is malformed");
        return MOE_ERR_INPUT;
    }
    int64_t L = faidx_seq_len(v->fai, chrom); /* int: htslib 1.16 */
    /* the reference from the window start: the REF window, and a deletion's fill after it */
    int64_t lo = s > 0 ? s : 0, hi = s + 2 * W + rlen < L ? s + 2 * W + rlen : L, len = 0;
    char *ref = hi > lo ? faidx_fetch_seq64(v->fai, chrom, lo, hi - 1, &len) : NULL;
    if (hi > lo && (!ref || len != hi - lo)) {
        free(ref);
        return moe_err_set(err, MOE_ERR_RUNTIME, v->o->fasta, "cannot read %s:%" PRId64 "-%" PRId64,
                           chrom, lo + 1, hi);
    }
    int match = pos0 + rlen <= L;
    for (int64_t i = 0; match && i < rlen; i++)
        match = toupper((unsigned char)ref_allele[i]) == toupper((unsigned char)ref[pos0 - lo + i]);
    moe_status rc = MOE_OK;
    int status = ALT_SCORED;
    if (!match && !v->o->check_ref_warn) {
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf,
                    "%s:%" PRId64 ": REF '%.40s' does not match the reference %s there ('%.*s')",
                    chrom, pos0 + 1, ref_allele, v->o->fasta,
                    (int)(pos0 < L ? (rlen < 40 ? rlen : 40) : 0), ref ? ref + (pos0 - lo) : "");
        moe_err_at_record(err, v->rec_no);
        moe_err_hint(err, "use the FASTA the calls were made against, or --check-ref warn to "
                          "skip such records");
        rc = MOE_ERR_INPUT;
    } else if (!match) {
        if (v->sum.skip_ref < 5)
            moe_log_warn("record %" PRId64 " (%s:%" PRId64 "): REF does not match the reference: "
                         "skipped",
                         v->rec_no, chrom, pos0 + 1);
        status = ALT_REF_MISMATCH;
    } else if (s < 0 || s + W > L || pos0 + rlen > s + W) {
        status = ALT_EDGE; /* the window runs off the contig, or the REF off the window */
    }
    for (int a = 0; a < st->n_alt; a++)
        if (st->status[a] == ALT_SCORED) st->status[a] = status;
    if (rc == MOE_OK && status == ALT_SCORED)
        rc = site_windows(v, st, ref, len, rlen, pos0 - s, err);
    free(ref);
    if (rc != MOE_OK) {
        if (!err->file[0]) snprintf(err->file, sizeof err->file, "%s", v->o->vcf);
        if (!err->record) moe_err_at_record(err, v->rec_no);
        return rc;
    }
    for (int a = 0; a < st->n_alt; a++) {
        v->sum.skip_symbolic += st->status[a] == ALT_SYMBOLIC;
        v->sum.skip_edge += st->status[a] == ALT_EDGE;
        v->sum.skip_ref += st->status[a] == ALT_REF_MISMATCH;
    }
    for (int r = 0; r < 2; r++)
        v->chunk_tokens += st->ref[r].n;
    for (int a = 0; a < 2 * st->n_alt; a++)
        v->chunk_tokens += st->alt[a].n;
    return MOE_OK;
}

/* ---- the run of sites ---- */

/* -r regions: 0-based [beg, end) of a contig name; a record overlapping one is kept. */
static int in_regions(const vcf_sites *v, const bcf1_t *rec) {
    if (v->o->n_regions == 0) return 1;
    const char *chrom = bcf_seqname_safe(v->hdr, rec);
    for (int i = 0; i < v->o->n_regions; i++) {
        hts_pos_t beg, end;
        const char *r = v->o->regions[i], *e = hts_parse_reg64(r, &beg, &end);
        if (e && (size_t)(e - r) == strlen(chrom) && strncmp(r, chrom, (size_t)(e - r)) == 0 &&
            rec->pos < end && rec->pos + rec->rlen > beg)
            return 1;
    }
    return 0;
}

void score_vcf_sites_clear(vcf_sites *v) {
    for (int64_t i = 0; i < v->n_sites; i++) {
        vsite *st = &v->sites[i];
        if (st->rec) bcf_destroy(st->rec);
        for (int r = 0; r < 2; r++)
            free(st->ref[r].ids), free(st->lp[r]);
        for (int a = 0; st->alt && a < 2 * st->n_alt; a++)
            free(st->alt[a].ids);
        free(st->alt);
        free(st->status);
        free(st->llr);
    }
    v->n_sites = v->chunk_tokens = 0;
}

moe_status score_vcf_sites_open(vcf_sites *v, const moe_score_vcf_opts *o, moe_err *err) {
    memset(v, 0, sizeof *v);
    v->o = o;
    for (int i = 0; i < o->n_regions; i++) {
        hts_pos_t beg, end;
        if (!hts_parse_reg64(o->regions[i], &beg, &end)) {
            moe_err_set(err, MOE_ERR_INPUT, NULL, "-r %s is not a region", o->regions[i]);
            moe_err_hint(err, "write chr, chr:beg or chr:beg-end (1-based, inclusive)");
            return MOE_ERR_INPUT;
        }
    }
    return open_fasta(v, o->fasta, err);
}

moe_status score_vcf_sites_input(vcf_sites *v, moe_err *err) {
    score_vcf_sites_end(v);
    const char *path = v->o->vcf;
    v->in = hts_open(path, "r");
    if (!v->in) return moe_err_errno(err, path, "cannot open the VCF/BCF");
    if (hts_get_format(v->in)->category != variant_data) {
        char *what = hts_format_description(hts_get_format(v->in)); /* malloc'ed */
        moe_err_set(err, MOE_ERR_INPUT, path, "not a VCF or BCF file (%s)",
                    what ? what : "unknown format");
        free(what);
        return MOE_ERR_INPUT;
    }
    v->hdr = bcf_hdr_read(v->in);
    if (!v->hdr) return moe_err_set(err, MOE_ERR_INPUT, path, "cannot read the VCF header");
    if (!(v->rec = bcf_init())) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    return MOE_OK;
}

moe_status score_vcf_sites_model(vcf_sites *v, const score_model *sm, moe_err *err) {
    v->sm = sm;
    int64_t ctx = sm->max_content * moe_tokenizer_max_bases_per_token(sm->tok);
    v->W = v->o->window ? v->o->window : ctx < 8192 ? ctx : 8192;
    if (v->W < 2 || v->W > ctx) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "--window %" PRId64 " must be between 2 and %" PRId64 " bases (the model's "
                    "context)",
                    v->W, ctx);
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

/* What htslib reads from a VCF text line without an error (and without setting the record's
 * errcode, which flags only contigs and tags the header lacks, and which it then defines), but
 * would write back changed or read past: fewer than 8 columns (a record without FILTER and
 * INFO bytes, which writing it then reads past), fewer than the header's samples ask for
 * (writing it fails), a POS that is not a number (read as 0), a
 * QUAL that is not one (written back as 0), an empty ALT allele (written back as "."). Fields
 * come from htslib's line buffer, where parsing wrote a NUL over each tab it split at.
 * MOE_OK, or MOE_ERR_INPUT naming the column. */
static moe_status vcf_text_check(const vcf_sites *v, moe_err *err) {
    const char *s = v->in->line.s, *end = s + v->in->line.l, *f[8];
    int cols = 0, ns = bcf_hdr_nsamples(v->hdr);
    for (const char *p = s; p <= end; p++) /* the columns, and the first 8's starts */
        if (p == s || p[-1] == '\t' || p[-1] == '\0') {
            if (cols < 8) f[cols] = p;
            cols++;
        }
    if (cols < 8) {
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf,
                    "%d tab-separated columns; a VCF record has at least 8 (CHROM to INFO)", cols);
        return MOE_ERR_INPUT;
    }
    if (ns > 0 && cols < 9 + ns) { /* written back, it fails in htslib: "cannot write" */
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf,
                    "%d tab-separated columns; the header names %d sample%s, so a record has %d "
                    "(CHROM to INFO, FORMAT, one per sample)",
                    cols, ns, ns == 1 ? "" : "s", 9 + ns);
        return MOE_ERR_INPUT;
    }
    size_t pos_len = strcspn(f[1], "\t"), alt_len = strcspn(f[4], "\t"),
           qual_len = strcspn(f[5], "\t");
    int empty_allele = alt_len == 0 || f[4][0] == ',' || f[4][alt_len - 1] == ',';
    for (size_t i = 1; i < alt_len; i++)
        empty_allele |= f[4][i] == ',' && f[4][i - 1] == ',';
    char *qend = NULL;
    if (pos_len == 0 || strspn(f[1], "0123456789") != pos_len)
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "POS '%.*s' is not a number", (int)pos_len,
                    f[1]);
    else if (!(qual_len == 1 && f[5][0] == '.') &&
             (qual_len == 0 || (strtod(f[5], &qend), qend != f[5] + qual_len)))
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "QUAL '%.*s' is neither a number nor '.'",
                    (int)qual_len, f[5]);
    else if (empty_allele)
        moe_err_set(err, MOE_ERR_INPUT, v->o->vcf, "ALT '%.*s' has an empty allele", (int)alt_len,
                    f[4]);
    else
        return MOE_OK;
    moe_err_hint(err, "the record is malformed (VCF 4.x: columns separated by single tabs, no "
                      "NUL bytes; POS an integer, QUAL a number or '.', ALT alleles separated by "
                      "single commas)");
    return MOE_ERR_INPUT;
}

int score_vcf_sites_next(vcf_sites *v, moe_err *err) {
    int rc;
    while ((rc = bcf_read(v->in, v->hdr, v->rec)) == 0) {
        v->rec_no++;
        if (v->in->format.format == vcf && vcf_text_check(v, err) != MOE_OK) {
            moe_err_at_record(err, v->rec_no);
            return -1;
        }
        if (in_regions(v, v->rec)) return add_site(v, v->rec, err) == MOE_OK ? 1 : -1;
    }
    if (rc >= -1) return 0;
    moe_err_set(err, MOE_ERR_INPUT, v->o->vcf,
                "htslib cannot read this record (its message above says why)");
    moe_err_at_record(err, v->rec_no + 1);
    return -1;
}

void score_vcf_sites_end(vcf_sites *v) {
    score_vcf_sites_clear(v);
    if (v->rec) bcf_destroy(v->rec);
    if (v->hdr) bcf_hdr_destroy(v->hdr);
    if (v->in) hts_close(v->in);
    v->rec = NULL;
    v->hdr = NULL;
    v->in = NULL;
    v->rec_no = 0;
}

void score_vcf_sites_close(vcf_sites *v) {
    score_vcf_sites_end(v);
    if (v->fai) fai_destroy(v->fai);
    free(v->sites);
    free(v->buf);
    moe_token_buf_free(&v->enc);
    memset(v, 0, sizeof *v);
}
