/* seqio_hts: SAM/BAM/CRAM records through htslib (with the read filter, reverse-strand
 * restoration and indexed regions) and indexed FASTA regions through faidx.
 *
 * The one thing to know: htslib must never reach a network reference server. Unless the
 * user set REF_PATH / REF_CACHE themselves, both are pointed below /dev/null (a path that
 * can never exist), so a CRAM whose reference is not given with --reference fails to decode
 * and we report that, naming the file and the option to use. */
#include <errno.h>
#include <htslib/hfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqio/seqio_impl.h"

static const char NO_REF_PATH[] = "/dev/null/moe-genomics-no-network-reference/%s";

static moe_status no_index(moe_seq_reader *r, const char *what, moe_err *err) {
    moe_err_set(err, MOE_ERR_INPUT, r->path, "--region needs an index (%s) and none was found",
                what);
    moe_err_hint(err, "index the sorted file: samtools index %s", r->path);
    return MOE_ERR_INPUT;
}

/* A region "name:beg-end" whose end is before its start (htslib reports it as an unknown
 * name): MOE_ERR_INPUT saying so; anything else is left to htslib's parser. */
static moe_status check_region_order(const moe_seq_reader *r, const char *reg, moe_err *err) {
    const char *colon = strrchr(reg, ':');
    long long beg, end;
    char tail;
    if (!colon || sscanf(colon + 1, "%lld-%lld%c", &beg, &end, &tail) != 2 || end >= beg)
        return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, r->path, "region \"%s\": end %lld is before start %lld", reg,
                end, beg);
    moe_err_hint(err, "regions are chr:beg-end with beg <= end (1-based, inclusive)");
    return MOE_ERR_INPUT;
}

void moe_seqio_no_network_refs(void) {
    /* setenv is process-wide, but only ever to the same constant, and only when unset;
       moe_seqio_opts_defaults() calls this first, before any reader thread exists */
    if (!getenv("REF_PATH")) setenv("REF_PATH", NO_REF_PATH, 0);
    if (!getenv("REF_CACHE")) setenv("REF_CACHE", NO_REF_PATH, 0);
}

moe_status moe_seqio_sam_open(moe_seq_reader *r, hFILE *hf, moe_err *err) {
    moe_seqio_no_network_refs();
    r->hts = hts_hopen(hf, r->path, "r");
    if (!r->hts) {
        hclose_abruptly(hf);
        moe_err_set(err, MOE_ERR_INPUT, r->path, "htslib cannot open the %s file",
                    moe_seqio_format_name(r->fmt));
        return MOE_ERR_INPUT;
    }
    if (r->fmt == MOE_SEQ_CRAM && r->opts.reference &&
        hts_set_fai_filename(r->hts, r->opts.reference) != 0) {
        moe_err_set(err, MOE_ERR_INPUT, r->opts.reference,
                    "cannot use as the CRAM reference (missing file, or cannot write/read its "
                    ".fai index)");
        moe_err_hint(err, "the reference must be a FASTA file, plain or bgzip, with `samtools "
                          "faidx` run on it if its directory is read-only");
        return MOE_ERR_INPUT;
    }
    htsThreadPool shared = {r->opts.pool, moe_seqio_read_ahead(r)};
    if (r->opts.threads > 0 && r->opts.pool)
        hts_set_thread_pool(r->hts, &shared);
    else if (r->opts.threads > 0)
        hts_set_threads(r->hts, r->opts.threads);
    /* BAM's BGZF empty block, CRAM's EOF container: htslib only warns when they are absent,
       and a CRAM cut at a container boundary decodes cleanly up to the cut */
    if (r->fmt != MOE_SEQ_SAM && strcmp(r->path, "-") != 0 && hts_check_EOF(r->hts) == 0) {
        moe_err_set(err, MOE_ERR_INPUT, r->path,
                    "%s end-of-file marker missing: the file is truncated",
                    moe_seqio_format_name(r->fmt));
        moe_err_hint(err, "re-create or re-download the file (samtools quickcheck says the same)");
        return MOE_ERR_INPUT;
    }
    r->hdr = sam_hdr_read(r->hts);
    if (!r->hdr) {
        moe_err_set(err, MOE_ERR_INPUT, r->path, "cannot read the %s header",
                    moe_seqio_format_name(r->fmt));
        moe_err_hint(err, "the file is truncated or corrupt");
        return MOE_ERR_INPUT;
    }
    r->b = bam_init1();
    if (!r->b) return moe_err_set(err, MOE_ERR_RUNTIME, r->path, "out of memory");
    if (r->part_by_pos && r->fmt != MOE_SEQ_BAM) {
        if (r->fmt == MOE_SEQ_SAM) {
            moe_err_set(err, MOE_ERR_INPUT, r->path, "--part cannot split SAM text");
            moe_err_hint(err, "convert it to BAM first: samtools view -b -o x.bam %s", r->path);
            return MOE_ERR_INPUT;
        }
        r->part_by_pos = 0; /* CRAM: by reference sequence */
        if (moe_seqio_part_by_tid(r, err) != MOE_OK) return err->status;
    }
    if (r->n_regions > 0) {
        if (r->fmt == MOE_SEQ_SAM || strcmp(r->path, "-") == 0) {
            moe_err_set(err, MOE_ERR_INPUT, r->path,
                        "--region needs an indexed BAM or CRAM file (not SAM, not stdin)");
            moe_err_hint(err, "convert and index it: samtools sort -o x.bam; samtools index "
                              "x.bam");
            return MOE_ERR_INPUT;
        }
        for (int i = 0; i < r->n_regions; i++)
            if (check_region_order(r, r->regions[i], err) != MOE_OK) return MOE_ERR_INPUT;
        r->idx = sam_index_load(r->hts, r->path);
        if (!r->idx) return no_index(r, r->fmt == MOE_SEQ_BAM ? ".bai/.csi" : ".crai", err);
        r->itr = sam_itr_regarray(r->idx, r->hdr, r->regions, (unsigned)r->n_regions);
        if (!r->itr) {
            moe_err_set(err, MOE_ERR_INPUT, r->path,
                        "a --region names a reference sequence that is not in the header");
            moe_err_hint(err,
                         "regions look like chr, chr:beg or chr:beg-end (1-based); "
                         "`samtools view -H %s` lists the names",
                         r->path);
            return MOE_ERR_INPUT;
        }
    }
    return MOE_OK;
}

/* CRAM parts: where a record on reference tid lies for r's part (as moe_seqio_part_where),
 * or 2 with err when the file is not sorted after all. */
static int tid_where(moe_seq_reader *r, int tid, moe_err *err) {
    int at = tid < 0 || tid >= r->n_tids ? r->n_tids : tid;
    if (at < r->last_tid) {
        moe_err_set(err, MOE_ERR_INPUT, r->path,
                    "record %lld is out of coordinate order, which --part on CRAM needs",
                    (long long)r->record_no + 1);
        moe_err_hint(err, "sort it (samtools sort), or convert it to BAM");
        return 2;
    }
    r->last_tid = at;
    int owner = r->tid_owner[at];
    return owner < r->opts.part ? -1 : owner > r->opts.part ? 1 : 0;
}

static int keep(const moe_seq_reader *r, const bam1_t *b) {
    uint16_t f = b->core.flag;
    if (f & r->opts.exclude_flags) return 0;
    if ((f & r->opts.require_flags) != r->opts.require_flags) return 0;
    return b->core.qual >= r->opts.min_mapq;
}

int moe_seqio_sam_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err) {
    bam1_t *b = r->b;
    for (;;) {
        int64_t key = r->part_by_pos ? bgzf_tell(r->hts->fp.bgzf) >> 16 : 0;
        int where = moe_seqio_part_where(r, key);
        if (where > 0) return 0;
        int ret = r->itr ? sam_itr_next(r->hts, r->itr, b) : sam_read1(r->hts, r->hdr, b);
        if (ret == -1) return 0;
        if (ret < -1) {
            moe_err_set(err, MOE_ERR_INPUT, r->path, "cannot decode record %lld",
                        (long long)r->record_no + 1);
            if (r->fmt == MOE_SEQ_CRAM && !r->opts.reference && sam_hdr_nref(r->hdr) > 0)
                moe_err_hint(err, "this CRAM may need its reference sequence: pass --reference "
                                  "FILE.fa (network reference servers are never used); "
                                  "otherwise the file is corrupt");
            else if (r->fmt == MOE_SEQ_CRAM && r->opts.reference)
                moe_err_hint(err, "check that --reference is the FASTA this CRAM was made "
                                  "against; otherwise the file is truncated or corrupt");
            else
                moe_err_hint(err, "the file is truncated or corrupt");
            return -1;
        }
        if (r->tid_owner && (where = tid_where(r, b->core.tid, err)) != 0) {
            if (where == 2) return -1;
            if (where > 0) return 0;
        }
        r->record_no++;
        int64_t n = b->core.l_qseq;
        int kept = keep(r, b);
        r->n_kept += kept && n > 0;
        if (where < 0) continue; /* another part's */
        r->n_read++;
        if (!kept) {
            r->n_filtered++;
            continue;
        }
        if (n == 0) {
            moe_seqio_note_empty(r, bam_get_qname(b));
            continue;
        }
        r->name.l = r->seq.l = r->qual.l = 0;
        if (kputs(bam_get_qname(b), &r->name) < 0 ||
            (!r->opts.raw && ks_resize(&r->seq, (size_t)n + 1) < 0) ||
            ks_resize(&r->qual, (size_t)n + 1) < 0 || kputs("", &r->comment) < 0) {
            moe_err_set(err, MOE_ERR_RUNTIME, r->path, "out of memory");
            return -1;
        }
        r->comment.l = 0;
        r->comment.s[0] = '\0';
        const uint8_t *s = bam_get_seq(b), *q = bam_get_qual(b);
        int reverse = (b->core.flag & BAM_FREVERSE) && !r->opts.as_stored;
        if (!r->opts.raw) { /* raw: the caller decodes the 4-bit codes where htslib read them */
            moe_seqio_unpack_nt16(s, n, reverse, r->seq.s);
            r->seq.s[n] = '\0';
        }
        int has_qual = q[0] != 0xff && !r->opts.skip_qual;
        if (has_qual)
            for (int64_t i = 0; i < n; i++)
                r->qual.s[i] = (char)(q[reverse ? n - 1 - i : i] + 33);
        r->qual.s[has_qual ? n : 0] = '\0';
        char strand = reverse ? '-' : '+';
        rec->name = r->name.s;
        rec->comment = r->comment.s;
        rec->seq = r->opts.raw ? (const char *)s : r->seq.s;
        rec->len = n;
        rec->qual = has_qual ? r->qual.s : NULL;
        rec->src_start = 0;
        rec->src_end = n;
        rec->strand = strand;
        rec->raw = r->opts.raw ? MOE_SEQ_RAW_NT16 : 0;
        rec->record_no = r->record_no;
        rec->ordinal = r->n_kept;
        return 1;
    }
}

void moe_seqio_unpack_nt16(const uint8_t *s, int64_t n, int reverse, char *out) {
    for (int64_t i = 0; i < n / 2; i++) { /* two bases per packed byte */
        out[2 * i] = seq_nt16_str[s[i] >> 4];
        out[2 * i + 1] = seq_nt16_str[s[i] & 15];
    }
    if (n & 1) out[n - 1] = seq_nt16_str[bam_seqi(s, n - 1)];
    if (reverse) moe_seqio_revcomp(out, n);
}

moe_status moe_seqio_fai_open(moe_seq_reader *r, moe_err *err) {
    r->fai = fai_load3(r->path, NULL, NULL, FAI_CREATE);
    if (!r->fai) {
        moe_err_set(err, MOE_ERR_INPUT, r->path,
                    "cannot load or build the FASTA index (.fai) needed for --region");
        moe_err_hint(err, "regions need plain or bgzip FASTA (not gzip: `zcat x.fa.gz | bgzip > "
                          "x.fa.bgz`) in a writable directory, or an existing .fai (and .gzi)");
        return MOE_ERR_INPUT;
    }
    for (int i = 0; i < r->n_regions; i++) {
        int tid;
        hts_pos_t beg, end;
        if (check_region_order(r, r->regions[i], err) != MOE_OK) return MOE_ERR_INPUT;
        if (!fai_parse_region(r->fai, r->regions[i], &tid, &beg, &end, 0)) {
            moe_err_set(err, MOE_ERR_INPUT, r->path, "region \"%s\" is not in the FASTA index",
                        r->regions[i]);
            moe_err_hint(err,
                         "regions look like chr, chr:beg or chr:beg-end (1-based, "
                         "inclusive); the .fai lists the names (first: %s)",
                         faidx_nseq(r->fai) > 0 ? faidx_iseq(r->fai, 0) : "none");
            return MOE_ERR_INPUT;
        }
    }
    return MOE_OK;
}

int moe_seqio_fai_next(moe_seq_reader *r, moe_seq_record *rec, moe_err *err) {
    while (r->region_i < r->n_regions) {
        const char *reg = r->regions[r->region_i++];
        int tid;
        hts_pos_t beg, end, len;
        fai_parse_region(r->fai, reg, &tid, &beg, &end, 0); /* validated at open */
        const char *name = faidx_iseq(r->fai, tid);
        hts_pos_t clen = faidx_seq_len(r->fai, name); /* int in htslib 1.16 */
        if (end > clen) end = clen;
        r->record_no++;
        r->n_read++;
        free(r->fai_seq);
        r->fai_seq = NULL;
        if (beg >= end) {
            moe_seqio_note_empty(r, reg);
            continue;
        }
        r->fai_seq = faidx_fetch_seq64(r->fai, name, beg, end - 1, &len);
        if (!r->fai_seq || len != end - beg) {
            moe_err_set(err, MOE_ERR_INPUT, r->path, "cannot read region %s (got %lld bases)", reg,
                        (long long)(r->fai_seq ? len : -1));
            moe_err_hint(err, "the .fai index may be stale: delete it and run again");
            return -1;
        }
        r->name.l = 0;
        if (kputs(name, &r->name) < 0) {
            moe_err_set(err, MOE_ERR_RUNTIME, r->path, "out of memory");
            return -1;
        }
        rec->name = r->name.s;
        rec->comment = "";
        rec->seq = r->fai_seq;
        rec->len = len;
        rec->qual = NULL;
        rec->src_start = beg;
        rec->src_end = end;
        rec->strand = '+';
        rec->record_no = r->record_no;
        rec->ordinal = ++r->n_kept;
        return 1;
    }
    return 0;
}

moe_status moe_seqio_part_by_tid(moe_seq_reader *r, moe_err *err) {
    kstring_t so = KS_INITIALIZE;
    int sorted = sam_hdr_find_tag_hd(r->hdr, "SO", &so) == 0 && strcmp(so.s, "coordinate") == 0;
    ks_free(&so);
    if (!sorted) {
        moe_err_set(err, MOE_ERR_INPUT, r->path,
                    "--part on CRAM needs a coordinate-sorted file (@HD SO:coordinate)");
        moe_err_hint(err,
                     "sort it (samtools sort), or convert it to BAM, which splits in any order");
        return MOE_ERR_INPUT;
    }
    int n_seq = sam_hdr_nref(r->hdr), n_parts = r->opts.n_parts;
    int64_t total = 0, at = 0;
    for (int t = 0; t < n_seq; t++)
        total += sam_hdr_tid2len(r->hdr, t);
    if (!(r->tid_owner = malloc(((size_t)n_seq + 1) * sizeof *r->tid_owner)))
        return moe_err_set(err, MOE_ERR_RUNTIME, r->path, "out of memory");
    for (int t = 0; t < n_seq; t++) {
        /* a sequence goes to the part whose share of the total length holds its start */
        int owner = total > 0 ? (int)((double)at / (double)total * n_parts) : 0;
        r->tid_owner[t] = owner < n_parts ? owner : n_parts - 1;
        at += sam_hdr_tid2len(r->hdr, t);
    }
    r->tid_owner[n_seq] = n_parts - 1; /* unplaced reads come last */
    r->n_tids = n_seq;
    r->last_tid = 0;
    return MOE_OK;
}
