/* ds4_e2e_logprob.c — porter's driver for the official logprob vectors on the user's model.
 *
 * Ours, not ds4's: porter links this file with ds4.o and the workspace's CUDA
 * backend in a scratch copy of the user's checkout (targets/ds4/e2e/logprob.py).
 * It only runs ds4's public API (ds4.h) and writes what the API returns; it
 * decides nothing.  The backend's host code runs in this process, so whatever
 * this process writes, prints or returns is data that porter validates in its
 * own process, against expected answers this process is never shown: the job
 * file names the cases and prompts, never the official tokens or logprobs.
 *
 * Usage: ds4_e2e_logprob [--cpu] MODEL JOB RESULTS
 *
 * JOB (written by porter; prompt paths relative to the working directory):
 *   ds4-e2e-logprob-job v1
 *   case <id> <ctx> <nsteps> <prompt-file>
 *
 * RESULTS (one block per case that ran, flushed per step):
 *   ds4-e2e-logprob-results v1
 *   case <id> <nsteps>
 *   step <i> <argmax token id> <n>      n = what ds4_session_top_logprobs returned
 *   top <token id> <logprob>            n lines, in the API's order
 *   end <id>
 *   done                                after the last case
 * Per case, as a greedy replay does: the prompt is the chat encoding of the
 * prompt file (no system text, thinking off), prefilled into a session of
 * <ctx>; step i reads the top-20 and the argmax, then evaluates the argmax.
 * A case that cannot run writes no block and the exit code is 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4.h"

#define JOB_HEADER "ds4-e2e-logprob-job v1"
#define RESULTS_HEADER "ds4-e2e-logprob-results v1"
#define TOP_K 20
#define MAX_STEPS 16

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            char *grown = realloc(buf, cap * 2 + 1);
            if (!grown) { free(buf); buf = NULL; break; }
            buf = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    return buf;
}

/* 0 when the case's block was written whole. */
static int run_case(ds4_engine *engine, FILE *out, const char *id, int ctx, int nsteps, const char *prompt_path) {
    char *text = read_file(prompt_path);
    if (!text) {
        fprintf(stderr, "ds4-e2e-logprob: %s: cannot read %s\n", id, prompt_path);
        return 1;
    }
    ds4_tokens prompt = {0};
    ds4_encode_chat_prompt(engine, "", text, DS4_THINK_NONE, &prompt);
    free(text);

    ds4_session *session = NULL;
    if (ds4_session_create(&session, engine, ctx) != 0 || !session) {
        fprintf(stderr, "ds4-e2e-logprob: %s: no session of ctx %d\n", id, ctx);
        ds4_tokens_free(&prompt);
        return 1;
    }
    char err[256] = "";
    int rc = 0;
    if (ds4_session_sync(session, &prompt, err, sizeof err) != 0) {
        fprintf(stderr, "ds4-e2e-logprob: %s: prefill failed: %s\n", id, err);
        rc = 1;
    }
    if (rc == 0) fprintf(out, "case %s %d\n", id, nsteps);
    for (int i = 0; rc == 0 && i < nsteps; i++) {
        ds4_token_score scores[TOP_K];
        int n = ds4_session_top_logprobs(session, scores, TOP_K);
        if (n < 0 || n > TOP_K) n = 0;
        int token = ds4_session_argmax(session);
        fprintf(out, "step %d %d %d\n", i, token, n);
        /* %.9g round-trips a float; a non-finite value prints as nan/inf and porter refuses it */
        for (int j = 0; j < n; j++) fprintf(out, "top %d %.9g\n", scores[j].id, (double)scores[j].logprob);
        fflush(out);
        if (i + 1 < nsteps && ds4_session_eval(session, token, err, sizeof err) != 0) {
            fprintf(stderr, "ds4-e2e-logprob: %s: eval at step %d failed: %s\n", id, i, err);
            rc = 1;
        }
    }
    if (rc == 0) fprintf(out, "end %s\n", id);
    fflush(out);
    ds4_session_free(session);
    ds4_tokens_free(&prompt);
    return rc;
}

int main(int argc, char **argv) {
    int argi = 1;
    ds4_backend backend = DS4_BACKEND_CUDA;
    if (argi < argc && !strcmp(argv[argi], "--cpu")) {  /* ds4's CPU path: the driver's own smoke test */
        backend = DS4_BACKEND_CPU;
        argi++;
    }
    if (argc - argi != 3) {
        fprintf(stderr, "usage: ds4_e2e_logprob [--cpu] MODEL JOB RESULTS\n");
        return 2;
    }
    const char *model = argv[argi], *job_path = argv[argi + 1], *results_path = argv[argi + 2];

    FILE *job = fopen(job_path, "r");
    if (!job) {
        fprintf(stderr, "ds4-e2e-logprob: cannot read %s\n", job_path);
        return 2;
    }
    char line[2048];
    if (!fgets(line, sizeof line, job) || strncmp(line, JOB_HEADER, strlen(JOB_HEADER)) != 0) {
        fprintf(stderr, "ds4-e2e-logprob: %s is not a job file\n", job_path);
        fclose(job);
        return 2;
    }
    FILE *out = fopen(results_path, "w");
    if (!out) {
        fprintf(stderr, "ds4-e2e-logprob: cannot write %s\n", results_path);
        fclose(job);
        return 2;
    }
    fprintf(out, "%s\n", RESULTS_HEADER);
    fflush(out);

    ds4_engine_options opt;
    memset(&opt, 0, sizeof opt);
    opt.model_path = model;
    opt.backend = backend;
    ds4_engine *engine = NULL;
    if (ds4_engine_open(&engine, &opt) != 0 || !engine) {
        fprintf(stderr, "ds4-e2e-logprob: cannot open %s\n", model);
        fclose(out);
        fclose(job);
        return 1;
    }

    int failed = 0;
    while (fgets(line, sizeof line, job)) {
        char id[96], prompt_path[1024];
        int ctx = 0, nsteps = 0;
        if (line[0] == '\n' || line[0] == '#') continue;
        if (sscanf(line, "case %95s %d %d %1023s", id, &ctx, &nsteps, prompt_path) != 4 ||
            ctx <= 0 || nsteps <= 0 || nsteps > MAX_STEPS) {
            fprintf(stderr, "ds4-e2e-logprob: bad job line: %s", line);
            failed = 1;
            continue;
        }
        fprintf(stderr, "ds4-e2e-logprob: case %s\n", id);
        failed |= run_case(engine, out, id, ctx, nsteps, prompt_path);
    }
    fclose(job);
    ds4_engine_close(engine);
    fprintf(out, "done\n");
    fclose(out);
    return failed ? 1 : 0;
}
