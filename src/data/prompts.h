/* data/prompts.h — RL prompt files: one prompt per line with its expected answer
 * (docs/FORMATS.md "RL prompt files and rewards").
 *
 * A line is PROMPT, one TAB, ANSWER, then LF (the last line may lack its LF), e.g.
 * "12+34=\t46". Neither field is empty or holds a TAB, CR, LF or NUL byte; there is no
 * header, comment or blank line. `moetrain data math` writes math_prompts_train.tsv and
 * math_prompts_val.tsv next to its shards, line i being document i of that split. The
 * model is fed a prompt as its tokenizer's end of text followed by the prompt's tokens
 * (mt_prompts_encode; bytes for the byte tokenizer), as training documents start. */
#ifndef MT_DATA_PROMPTS_H
#define MT_DATA_PROMPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/tokenizer.h"

/* mt_prompts_load flags. MT_PROMPTS_MATH also checks every line is an arithmetic problem:
 * PROMPT is "EXPR=" with EXPR valid for mt_math_eval, ANSWER is its value in canonical
 * form (mt_math_canonical). */
#define MT_PROMPTS_MATH 1

typedef struct {
    size_t n;             /* prompts */
    const char **prompt;  /* [n] NUL-terminated, pointing into text */
    const char **answer;  /* [n] the expected answer strings */
    char *text;           /* the file's bytes, split in place */
    const mt_tokenizer *tk; /* set by mt_prompts_encode (not owned) */
    int32_t *tok;         /* every prompt's tokens, end-of-text first, one after another */
    size_t *tok_at;       /* [n + 1]: prompt i is tok[tok_at[i] .. tok_at[i+1]) */
} mt_prompt_set;

/* Reads a prompt file. Errors name path:line and what is wrong with that line (no TAB,
 * several TABs, an empty field, a CR or NUL byte; with MT_PROMPTS_MATH a prompt that is
 * not "EXPR=", an answer that is not canonical or not the expression's value), or an
 * unreadable or empty file. On error *s is zeroed and nothing needs freeing. */
int mt_prompts_load(const char *path, int flags, mt_prompt_set *s);
void mt_prompts_free(mt_prompt_set *s);

/* Encodes every prompt of s with tk (kept by pointer: it must outlive s) as the model is
 * fed it: tk's end-of-text, then the prompt's tokens. Errors name the file's line of a
 * prompt tk cannot take (a BPE: not UTF-8). */
int mt_prompts_encode(mt_prompt_set *s, const char *path, const mt_tokenizer *tk);
/* Tokens of prompt i (after mt_prompts_encode). */
size_t mt_prompt_len(const mt_prompt_set *s, size_t i);
/* Copies them into *buf (grown with realloc); returns their count. */
size_t mt_prompt_copy(const mt_prompt_set *s, size_t i, int32_t **buf);

/* The byte tokenizer's tokens of prompt: EOT, then one byte token per byte. */
size_t mt_prompt_ntokens(const char *prompt);
/* Writes those tokens to out (room for mt_prompt_ntokens(prompt)); returns their count. */
size_t mt_prompt_encode(const char *prompt, int32_t *out);

/* Streams a prompt file to path.tmp and renames it to path on finish, so a reader never
 * sees a half-written file. */
typedef struct {
    FILE *f;
    char *path, *tmp;
    uint64_t lines;
} mt_prompt_writer;

int mt_prompt_writer_open(mt_prompt_writer *w, const char *path);
/* Appends one line; refuses fields the loader would refuse (the error names path). */
int mt_prompt_writer_add(mt_prompt_writer *w, const char *prompt, size_t plen, const char *answer, size_t alen);
/* Flushes, fsyncs and renames into place; the writer is freed either way. */
int mt_prompt_writer_finish(mt_prompt_writer *w);
/* Drops the temporary file (error paths; safe after finish or on a zeroed writer). */
void mt_prompt_writer_abort(mt_prompt_writer *w);

#endif
