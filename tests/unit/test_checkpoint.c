/* test_checkpoint: checkpoint directories appear atomically with a MANIFEST that load
 * verifies: a flipped byte, a truncated or missing file is refused naming the file; a
 * MANIFEST cut short (at a line end or mid-line) or with a line dropped is refused naming
 * MANIFEST, one of the older format without a first line is read; `latest`
 * follows the newest checkpoint; only the newest `keep` survive; stale temporary directories
 * of a crashed writer are replaced. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "moe/ckpt.h"
#include "moe/fileio.h"
#include "testlib.h"

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return;
    fputs(text, fp);
    fclose(fp);
}

/* Writes a checkpoint of `step` with the files every checkpoint lists into run. */
static moe_status save(const char *run, int64_t step, int64_t keep, moe_err *err) {
    moe_ckpt_writer w;
    moe_status st = moe_ckpt_begin(&w, run, step, err);
    if (st != MOE_OK) return st;
    char p[4096], body[64];
    snprintf(body, sizeof body, "{\"step\": %lld}\n", (long long)step);
    write_text(moe_ckpt_path(&w, "trainer_state.json", p, sizeof p), body);
    write_text(moe_ckpt_path(&w, "model.safetensors", p, sizeof p), "0123456789abcdef");
    write_text(moe_ckpt_path(&w, "config.yaml", p, sizeof p), "model: {}\n");
    write_text(moe_ckpt_path(&w, "tokenizer.json", p, sizeof p), "{}\n");
    return moe_ckpt_commit(&w, keep, err);
}

/* The MANIFEST check of moe_ckpt_open (its first part) on dir. */
static moe_status verify(const char *dir, moe_err *err) {
    moe_ckpt c;
    moe_status st = moe_ckpt_open(&c, dir, MOE_CKPT_REPORT, err);
    if (st != MOE_OK) return st;
    *err = c.part_err[MOE_CKPT_PART_MANIFEST];
    moe_ckpt_close(&c);
    return err->status;
}

static void flip_byte(const char *path, long off) {
    FILE *fp = fopen(path, "r+b");
    if (!fp) return;
    fseek(fp, off, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, off, SEEK_SET);
    fputc(c ^ 0x01, fp);
    fclose(fp);
}

/* A MANIFEST cut short or edited is refused naming MANIFEST, never a file it does not
 * list (issue 18, defect 5); one of the older format (no first line) still opens.
 * manifest: the intact MANIFEST text of run/ckpt-00000040. */
static void check_cut_manifest(const char *manifest) {
    moe_err err;
    const char *path = "run/ckpt-00000040/MANIFEST";
    const char *body = strchr(manifest, '\n') + 1;
    char *copy = strdup(manifest);
    /* head -2: the first line and one file line */
    char *second = strchr(strchr(copy, '\n') + 1, '\n');
    second[1] = '\0';
    write_text(path, copy);
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.file, "MANIFEST") && strstr(err.msg, "cut short"), "%s: %s", err.file,
              err.msg);
    /* cut in the middle of a line ("… model.s") */
    const char *cut = strstr(manifest, "model.safetensors");
    snprintf(copy, strlen(manifest) + 1, "%.*s", (int)(cut - manifest + 7), manifest);
    write_text(path, copy);
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.file, "MANIFEST") && strstr(err.msg, "cut short") &&
                  strstr(err.msg, "does not end"),
              "%s: %s", err.file, err.msg);
    /* a file line dropped (a careless edit), the first line kept */
    snprintf(copy, strlen(manifest) + 1, "%s", manifest);
    char *tok = strstr(copy, " tokenizer.json\n"), *start = tok;
    while (start[-1] != '\n')
        start--;
    memmove(start, tok + strlen(" tokenizer.json\n"),
            strlen(tok + strlen(" tokenizer.json\n")) + 1);
    write_text(path, copy);
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "does not match its first line") && err.line == 1, "%s", err.msg);
    /* the older format: no first line; accepted whole, refused when cut at a line end */
    write_text(path, body);
    moe_err_clear(&err);
    CHECK_MSG(verify("run/ckpt-00000040", &err) == MOE_OK, "%s", err.msg);
    snprintf(copy, strlen(manifest) + 1, "%s", body);
    *strstr(copy, "tokenizer.json\n") = '\0';
    *strrchr(copy, '\n') = '\0';
    strcat(copy, "\n"); /* head -2 of the older format: config.yaml and model.safetensors */
    write_text(path, copy);
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "does not list tokenizer.json"), "%s", err.msg);
    /* zeros over the end of the first line (fuzz_ckpt: the parser wrote through a NULL) and,
     * in the older format, over the last lines (the parsing stopped there, unnoticed) */
    size_t len = strlen(manifest);
    memcpy(copy, manifest, len);
    memset(strchr(copy, '\n') - 4, 0, 4);
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fwrite(copy, 1, len, fp);
        fclose(fp);
    }
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "NUL byte") && err.line == 1, "%s (line %lld)", err.msg,
              (long long)err.line);
    snprintf(copy, strlen(manifest) + 1, "%s", body);
    size_t blen = strlen(body);
    memset(strstr(copy, " tokenizer.json\n"), 0, 4);
    fp = fopen(path, "wb");
    if (fp) {
        fwrite(copy, 1, blen, fp);
        fclose(fp);
    }
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "NUL byte"), "%s", err.msg);
    write_text(path, manifest);
    free(copy);
}

/* moe_ckpt_manifest_parse: text [strlen] parsed from memory into ck's entries; returns its
 * status and leaves the message in *err. */
static moe_status parse_manifest(const char *text, moe_ckpt *ck, moe_err *err) {
    char *copy = strdup(text);
    memset(ck, 0, sizeof *ck);
    moe_err_clear(err);
    moe_status st = moe_ckpt_manifest_parse(ck, copy, strlen(copy), "mem/MANIFEST", err);
    free(copy);
    return st;
}

/* The MANIFEST parser from memory (what moe_ckpt_open reads from RUN/ckpt-N/MANIFEST): a
 * version-2 text, an old one, and refusals naming the MANIFEST. */
static void test_manifest_parse(void) {
    const char *body = "12 0000abcd config.yaml\n34 12345678 model.safetensors\n"
                       "5 00000001 tokenizer.json\n6 00000002 trainer_state.json\n";
    char text[512], head[160];
    moe_ckpt_manifest_header(head, sizeof head, 4, moe_crc32(0, body, strlen(body)));
    snprintf(text, sizeof text, "%s\n%s", head, body);
    moe_ckpt ck;
    moe_err err;
    CHECK(parse_manifest(text, &ck, &err) == MOE_OK);
    CHECK_INT_EQ(ck.n_files, 4);
    CHECK(moe_ckpt_lists(&ck, "model.safetensors") && ck.files[1].size == 34 &&
          ck.files[1].crc == 0x12345678u);
    moe_ckpt_close(&ck);
    CHECK(parse_manifest(body, &ck, &err) == MOE_OK && ck.n_files == 4); /* no first line */
    moe_ckpt_close(&ck);
    text[strlen(text) - 2] = 'X'; /* a name changed below the first line */
    CHECK(parse_manifest(text, &ck, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "does not match its first line") && strstr(err.file, "mem/MANIFEST"),
              "%s: %s", err.file, err.msg);
    moe_ckpt_close(&ck);
    CHECK(parse_manifest("12 0000abcd config.yaml\n", &ck, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "does not list tokenizer.json"), "%s", err.msg);
    moe_ckpt_close(&ck);
}

int main(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree("run", &err);
    test_manifest_parse();

    char name[64];
    moe_ckpt_dir_name(42, name, sizeof name);
    CHECK(strcmp(name, "ckpt-00000042") == 0);
    CHECK_INT_EQ(moe_ckpt_step_of("run/ckpt-00000042"), 42);
    CHECK_INT_EQ(moe_ckpt_step_of("run/ckpt-00000042/"), 42);
    CHECK_INT_EQ(moe_ckpt_step_of("run/ckpt-12x"), -1);
    CHECK_INT_EQ(moe_ckpt_step_of("latest"), -1);

    /* No checkpoint yet. */
    char latest[4096];
    int found = 1;
    CHECK(moe_ckpt_latest("run", latest, sizeof latest, &found, &err) == MOE_OK);
    CHECK_INT_EQ(found, 0);

    /* A stale temporary directory from a crash must not survive or be taken as a checkpoint. */
    CHECK(moe_mkdirs("run/.ckpt-00000010.tmp", &err) == MOE_OK);
    write_text("run/.ckpt-00000010.tmp/junk", "x");

    for (int64_t s = 10; s <= 40; s += 10)
        CHECK(save("run", s, 3, &err) == MOE_OK);
    CHECK_MSG(err.status == MOE_OK, "%s", err.msg);
    CHECK(access("run/.ckpt-00000010.tmp", F_OK) != 0);
    CHECK(access("run/ckpt-00000010", F_OK) != 0); /* pruned: keep 3 */
    CHECK(access("run/ckpt-00000020/MANIFEST", F_OK) == 0);
    CHECK(access("run/ckpt-00000040/junk", F_OK) != 0);
    int64_t *steps;
    int n;
    CHECK(moe_ckpt_list("run", &steps, &n, &err) == MOE_OK);
    CHECK_INT_EQ(n, 3);
    if (n == 3) {
        CHECK_INT_EQ(steps[0], 20);
        CHECK_INT_EQ(steps[2], 40);
    }
    free(steps);
    CHECK(moe_ckpt_latest("run", latest, sizeof latest, &found, &err) == MOE_OK);
    CHECK(found && strcmp(latest, "run/ckpt-00000040") == 0);
    char *text;
    size_t len;
    CHECK(moe_read_file("run/latest", &text, &len, &err) == MOE_OK);
    if (text) CHECK(strcmp(text, "ckpt-00000040\n") == 0);
    free(text);

    /* MANIFEST: a first line with the number of file lines and their CRC32, then one line
     * per file, sorted, "size crc name"; CRC32("0123456789abcdef"). */
    CHECK(moe_read_file("run/ckpt-00000040/MANIFEST", &text, &len, &err) == MOE_OK);
    if (text) {
        char expect[256];
        snprintf(expect, sizeof expect, "\n16 %08x model.safetensors\n",
                 (unsigned)moe_crc32(0, "0123456789abcdef", 16));
        CHECK_MSG(strstr(text, expect) != NULL, "MANIFEST: %s", text);
        CHECK(strstr(text, " trainer_state.json\n") != NULL);
        const char *body = strchr(text, '\n') + 1;
        snprintf(expect, sizeof expect,
                 "# moe-genomics MANIFEST v2: 4 files, CRC32 %08x of the lines below\n",
                 (unsigned)moe_crc32(0, body, strlen(body)));
        CHECK_MSG(strncmp(text, expect, strlen(expect)) == 0, "MANIFEST: %s", text);
    }
    CHECK(verify("run/ckpt-00000040", &err) == MOE_OK);
    if (text) check_cut_manifest(text);
    free(text);

    /* A flipped byte: refused, naming the file, input error with a hint. */
    flip_byte("run/ckpt-00000040/model.safetensors", 5);
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.file, "model.safetensors") && strstr(err.msg, "CRC32"), "%s: %s", err.file,
              err.msg);
    CHECK(strstr(err.hint, "older checkpoint") != NULL);
    /* Truncated file: size mismatch. */
    CHECK(truncate("run/ckpt-00000030/trainer_state.json", 3) == 0);
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000030", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.file, "trainer_state.json") && strstr(err.msg, "size"));
    /* Missing file. */
    unlink("run/ckpt-00000020/model.safetensors");
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000020", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.file, "model.safetensors") != NULL);
    /* Garbled MANIFEST line; not a checkpoint at all. */
    write_text("run/ckpt-00000020/MANIFEST", "garbage\n");
    moe_err_clear(&err);
    CHECK(verify("run/ckpt-00000020", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.file, "MANIFEST") && err.line == 1);
    moe_err_clear(&err);
    mkdir("notckpt", 0777);
    CHECK(verify("notckpt", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "MANIFEST") != NULL);

    /* Re-saving an existing step replaces it; keep 0 keeps everything. */
    moe_err_clear(&err);
    CHECK(save("run", 40, 0, &err) == MOE_OK);
    CHECK(verify("run/ckpt-00000040", &err) == MOE_OK);
    CHECK(moe_ckpt_list("run", &steps, &n, &err) == MOE_OK);
    CHECK_INT_EQ(n, 3);
    free(steps);

    /* Without `latest`, the newest complete directory is found. */
    unlink("run/latest");
    CHECK(moe_ckpt_latest("run", latest, sizeof latest, &found, &err) == MOE_OK);
    CHECK(found && strcmp(latest, "run/ckpt-00000040") == 0);
    write_text("run/latest", "../../etc\n");
    moe_err_clear(&err);
    CHECK(moe_ckpt_latest("run", latest, sizeof latest, &found, &err) == MOE_ERR_INPUT);

    /* A run directory that cannot be created: input error naming it. */
    write_text("plainfile", "x");
    moe_err_clear(&err);
    moe_ckpt_writer w;
    CHECK(moe_ckpt_begin(&w, "plainfile/run", 1, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.file, "plainfile") != NULL);

    moe_err_clear(&err);
    moe_remove_tree("run", &err);
    unlink("plainfile");
    return test_summary("checkpoint");
}
