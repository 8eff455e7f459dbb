/* fuzz_fastx: libFuzzer harness for the FASTA/FASTQ reader (seqio over BGZF, format sniffing,
 * line and record checks). The input is written to a private temporary file (the reader
 * opens paths) and read to the end; errors are expected, crashes and leaks are findings. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_fixture.h"
#include "moe/seqio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* data [size] bytes: one input file. Always returns 0 (libFuzzer's contract). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[96];
    snprintf(path, sizeof path, "%s/moe-fuzz-fastx.%ld", fuzz_tmpdir(), (long)getpid());
    FILE *fp = fopen(path, "wb");
    if (!fp) abort();
    if (size && fwrite(data, 1, size, fp) != size) abort();
    fclose(fp);
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    moe_err err;
    moe_err_clear(&err);
    moe_seq_reader *r = NULL;
    if (moe_seqio_open(&r, path, &o, &err) == MOE_OK) {
        moe_seq_record rec;
        while (moe_seqio_next(r, &rec, &err) == 1) {
        }
        moe_seqio_close(r);
    }
    unlink(path);
    return 0;
}
