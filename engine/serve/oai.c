#include "oai.h"
#include "oai_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char **param, const char *p, int rc,
		const char *fmt, const char *a)
{
	if (err && errlen)
		snprintf(err, errlen, fmt, a ? a : "");
	if (param)
		*param = p;
	return rc;
}

/* Length of the well-formed UTF-8 sequence at s[0..n) (1-4), or 0 if it is not one: a stray
 * continuation byte, an overlong form, a surrogate, a code point past U+10FFFF, or a sequence
 * cut short (RFC 3629). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	if (c < 0x80)
		return 1;
	size_t len = c >= 0xC2 && c <= 0xDF   ? 2
		     : c >= 0xE0 && c <= 0xEF ? 3
		     : c >= 0xF0 && c <= 0xF4 ? 4
					      : 0;
	if (!len || n < len)
		return 0;
	/* The second byte's range depends on the first (no overlongs, surrogates or > U+10FFFF). */
	unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
	unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if ((s[i] & 0xC0) != 0x80)
			return 0;
	return len;
}

static int utf8_valid(const char *s, size_t n)
{
	for (size_t i = 0, k; i < n; i += k)
		if (!(k = utf8_seq((const unsigned char *)s + i, n - i)))
			return 0;
	return 1;
}

void oai_text_offsets(const char *t, size_t n, const size_t *offs, int k, size_t *out)
{
	const unsigned char *u = (const unsigned char *)t;
	size_t i = 0, o = 0; /* t[i] is written at o; i is a character's start */
	for (int x = 0; x < k; x++) {
		size_t want = offs[x];
		for (;;) {
			if (i >= n)
				break;
			size_t len = utf8_seq(u + i, n - i);
			size_t step = len ? len : 1;
			if (i + step > want) /* want is inside (or at) this character */
				break;
			i += step;
			o += len ? len : 3;
		}
		out[x] = want > n && i >= n ? o + (want - n) : o;
	}
}

/* Adds text as a JSON string. Generated text can hold bytes that are not UTF-8 (a byte-level
 * token sampled on its own); each such byte becomes U+FFFD, so the response stays valid JSON,
 * which must be UTF-8 (RFC 8259). */
void oai_add_text(cJSON *o, const char *key, const char *text)
{
	size_t n = strlen(text);
	if (utf8_valid(text, n)) {
		cJSON_AddStringToObject(o, key, text);
		return;
	}
	char *fixed = malloc(3 * n + 1), *w = fixed;
	if (!fixed)
		return; /* out of memory: the key is left out, as by any failing cJSON_Add */
	for (size_t i = 0, k; i < n; i += k) {
		k = utf8_seq((const unsigned char *)text + i, n - i);
		if (k) {
			memcpy(w, text + i, k);
			w += k;
		} else {
			memcpy(w, "\xEF\xBF\xBD", 3);
			w += 3;
			k = 1;
		}
	}
	*w = 0;
	cJSON_AddStringToObject(o, key, fixed);
	free(fixed);
}

static char *dup_str(const char *s)
{
	size_t n = strlen(s);
	char *d = malloc(n + 1);
	if (d)
		memcpy(d, s, n + 1);
	return d;
}

/* Reads an optional string field; -EINVAL if present with another type (null = absent). */
static int opt_string(const cJSON *o, const char *name, char **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsString(v))
		return -EINVAL;
	*out = dup_str(v->valuestring);
	return *out ? 0 : -ENOMEM;
}

static int opt_number(const cJSON *o, const char *name, double lo, double hi, double *out,
		      int *present)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	if (present)
		*present = 0;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
	    v->valuedouble > hi)
		return -EINVAL;
	*out = v->valuedouble;
	if (present)
		*present = 1;
	return 0;
}

static int opt_bool(const cJSON *o, const char *name, int *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsBool(v))
		return -EINVAL;
	*out = cJSON_IsTrue(v);
	return 0;
}

/* Where a parser reports a failure: the message buffer and the parameter it names. */
struct perr {
	char *err;
	size_t errlen;
	const char **param;
};

static int bad(const struct perr *e, const char *p, int rc, const char *fmt, const char *a)
{
	return fail(e->err, e->errlen, e->param, p, rc, fmt, a);
}

static int bad_type(const struct perr *e, const char *p)
{
	return bad(e, p, -EINVAL, "'%s' has the wrong type", p);
}

static int bad_range(const struct perr *e, const char *p)
{
	return bad(e, p, -EINVAL, "'%s' is out of range", p);
}

/* A message's content: a string, or an array of parts: {"type":"text","text":...} (type may
 * be left out) and {"type":"image_url","image_url":{"url":...,"detail":...}}. The texts are
 * concatenated into *out; each image's URL is kept in img_urls[] (the cJSON strings, valid
 * while the tree is) for decode_images, its offset set. mi: the message's index. */
static int parse_content(const cJSON *c, int mi, struct oai_message *m, const char **img_urls,
			 int *n_urls, int max_images, const struct perr *e)
{
	static const char *const p = "messages";
	if (cJSON_IsString(c)) {
		m->content = dup_str(c->valuestring);
		return m->content ? 0 : -ENOMEM;
	}
	if (!cJSON_IsArray(c))
		return bad(e, p, -EINVAL,
			   "each message needs a 'content' string or array of parts%s", NULL);
	size_t total = 0;
	int n_img = 0, pi = 0;
	const cJSON *part;
	char where[48];
	cJSON_ArrayForEach(part, c)
	{
		snprintf(where, sizeof(where), "messages[%d].content[%d]", mi, pi++);
		const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
		if (!cJSON_IsObject(part) || (ty && !cJSON_IsString(ty)))
			return bad(e, p, -EINVAL, "%s must be an object with a string 'type'",
				   where);
		if (ty && !strcmp(ty->valuestring, "image_url")) {
			const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
			const cJSON *url = cJSON_GetObjectItemCaseSensitive(iu, "url");
			const cJSON *det = cJSON_GetObjectItemCaseSensitive(iu, "detail");
			if (!cJSON_IsObject(iu) || !cJSON_IsString(url) ||
			    (det && !cJSON_IsNull(det) && !cJSON_IsString(det)))
				return bad(
				    e, p, -EINVAL,
				    "%s: an image_url part needs 'image_url': {'url': string}",
				    where);
			if (*n_urls >= max_images)
				return bad(e, p, -EINVAL, "%s: too many images in one request",
					   where);
			img_urls[(*n_urls)++] = url->valuestring;
			n_img++;
			continue;
		}
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
		if ((ty && strcmp(ty->valuestring, "text") != 0))
			return bad(
			    e, p, -EINVAL,
			    "%s: part type must be 'text' or 'image_url' (input_audio, file, "
			    "... are not supported)",
			    where);
		if (!cJSON_IsString(t))
			return bad(e, p, -EINVAL, "%s: a text part needs a 'text' string", where);
		total += strlen(t->valuestring);
	}
	char *s = malloc(total + 1), *w = s;
	if (!s || (n_img && !(m->images = calloc((size_t)n_img, sizeof(*m->images))))) {
		free(s);
		return -ENOMEM;
	}
	m->content = s;
	cJSON_ArrayForEach(part, c)
	{
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
		const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
		if (ty && !strcmp(ty->valuestring, "image_url")) {
			m->images[m->n_images++].offset = (size_t)(w - s);
			continue;
		}
		size_t n = strlen(t->valuestring);
		memcpy(w, t->valuestring, n);
		w += n;
	}
	*w = 0;
	return 0;
}

/* Decodes every image part, in order, once the rest of the request is known to be good (a
 * request refused for its temperature costs no decoding). */
static int decode_images(const struct oai_limits *lim, struct oai_request *r,
			 const char *const *urls, const struct perr *e)
{
	struct img_limits il;
	img_limits_resolve(lim->img, &il);
	/* all the images of one request together: each is checked from its header against what
	 * is left, so a request of many bombs that each pass alone costs only their headers */
	uint64_t total =
	    lim->max_image_pixels_total ? lim->max_image_pixels_total : 2 * il.max_pixels;
	int k = 0;
	for (int mi = 0; mi < r->n_messages; mi++)
		for (int i = 0; i < r->messages[mi].n_images; i++, k++) {
			struct img_limits one = il;
			int by_total = total < il.max_pixels;
			if (by_total)
				one.max_pixels = total ? total : 1;
			char msg[200];
			struct img_image *im = &r->messages[mi].images[i].img;
			int rc = img_from_url(urls[k], strlen(urls[k]), &one, im, msg, sizeof(msg));
			if (rc == -ENOMEM)
				return rc;
			if (rc) {
				char full[300];
				snprintf(full, sizeof(full), "messages[%d], image %d: %s%s", mi, i,
					 msg,
					 rc == -E2BIG && by_total
					     ? " (what the request's images may have together)"
					     : "");
				return bad(e, "messages", -EINVAL, "%s", full);
			}
			total -= (uint64_t)im->w * im->h;
		}
	return 0;
}

int oai_count_images(const struct oai_request *r)
{
	int n = 0;
	for (int i = 0; i < r->n_messages; i++)
		n += r->messages[i].n_images;
	return n;
}

/* Chat: "messages", a non-empty array of {role, content}; their text length into *bytes. */
static int parse_messages(const cJSON *o, const struct oai_limits *lim, struct oai_request *r,
			  size_t *bytes, const char **urls, int *n_urls, const struct perr *e)
{
	static const char *const p = "messages";
	const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, p);
	if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
		return bad(e, p, -EINVAL, "'messages' must be a non-empty array%s", NULL);
	int n = cJSON_GetArraySize(msgs);
	if (n > lim->max_messages)
		return bad(e, p, -E2BIG, "too many messages%s", NULL);
	if (!(r->messages = calloc((size_t)n, sizeof(*r->messages))))
		return -ENOMEM;
	const cJSON *m;
	cJSON_ArrayForEach(m, msgs)
	{
		struct oai_message *dst = &r->messages[r->n_messages++];
		const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
		const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
		if (!cJSON_IsObject(m) || !cJSON_IsString(role) ||
		    (strcmp(role->valuestring, "system") != 0 &&
		     strcmp(role->valuestring, "user") != 0 &&
		     strcmp(role->valuestring, "assistant") != 0 &&
		     strcmp(role->valuestring, "developer") != 0))
			return bad(e, p, -EINVAL,
				   "each message needs a 'role' of system, user or assistant%s",
				   NULL);
		if (!(dst->role = dup_str(role->valuestring)))
			return -ENOMEM;
		if (!content)
			return bad(e, p, -EINVAL, "each message needs a 'content' string%s", NULL);
		int max_img = lim->max_images > 0 ? lim->max_images : OAI_DEF_MAX_IMAGES;
		int rc = parse_content(content, r->n_messages - 1, dst, urls, n_urls,
				       max_img < OAI_MAX_IMAGES ? max_img : OAI_MAX_IMAGES, e);
		if (rc)
			return rc;
		*bytes += strlen(dst->content);
	}
	return 0;
}

/* A list of token ids: integers in [0, INT32_MAX], at least one. */
static int token_list(const cJSON *a, struct oai_prompt *p)
{
	int n = cJSON_GetArraySize(a);
	if (n < 1 || !(p->toks = malloc((size_t)n * sizeof(int32_t))))
		return n < 1 ? -EINVAL : -ENOMEM;
	const cJSON *t;
	cJSON_ArrayForEach(t, a)
	{
		if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) ||
		    t->valuedouble < 0 || t->valuedouble > INT32_MAX)
			return -EINVAL;
		p->toks[p->n_toks++] = (int32_t)t->valuedouble;
	}
	return 0;
}

/* Completions: "prompt", a string, a list of strings, a list of token ids, or a list of such
 * lists; *bytes: its size (4 bytes a token id). */
static int parse_prompt(const cJSON *o, struct oai_request *r, size_t *bytes, const struct perr *e)
{
	const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt");
	int tokens = cJSON_IsArray(pr) && cJSON_IsNumber(pr->child); /* one list of ids */
	int n = cJSON_IsString(pr) || tokens ? 1 : cJSON_IsArray(pr) ? cJSON_GetArraySize(pr) : 0;
	if (n < 1 || n > OAI_MAX_PROMPTS)
		return bad(e, "prompt", -EINVAL,
			   "'prompt' must be a string, token ids, or a list of 1 to 16 of them%s",
			   NULL);
	if (!(r->prompts = calloc((size_t)n, sizeof(*r->prompts))))
		return -ENOMEM;
	r->n_prompts = n;
	for (int i = 0; i < n; i++) {
		const cJSON *p = cJSON_IsString(pr) || tokens ? pr : cJSON_GetArrayItem(pr, i);
		struct oai_prompt *dst = &r->prompts[i];
		int rc = 0;
		if (cJSON_IsString(p)) {
			rc = (dst->text = dup_str(p->valuestring)) ? 0 : -ENOMEM;
			*bytes += dst->text ? strlen(dst->text) : 0;
		} else if (cJSON_IsArray(p)) {
			rc = token_list(p, dst);
			*bytes += 4 * (size_t)dst->n_toks;
		} else {
			rc = -EINVAL;
		}
		if (rc == -ENOMEM)
			return rc;
		if (rc)
			return bad(
			    e, "prompt", -EINVAL,
			    "'prompt' must be a string, token ids (integers >= 0), or a list "
			    "of them%s",
			    NULL);
	}
	r->prompt = r->prompts[0].text;
	return 0;
}

/* "max_completion_tokens" (when not null) or "max_tokens": an integer in [1, the limit]. */
static int parse_max_tokens(const cJSON *o, const struct oai_limits *lim, struct oai_request *r,
			    const struct perr *e)
{
	const cJSON *mct = cJSON_GetObjectItemCaseSensitive(o, "max_completion_tokens");
	const char *mt = mct && !cJSON_IsNull(mct) ? "max_completion_tokens" : "max_tokens";
	double d;
	int present;
	if (opt_number(o, mt, 1, lim->max_tokens, &d, &present) || (present && d != floor(d))) {
		char range[64];
		snprintf(range, sizeof(range), "%d", lim->max_tokens);
		return bad(e, mt, -EINVAL, "max_tokens must be an integer between 1 and %s", range);
	}
	if (present)
		r->max_tokens = (int)d;
	return 0;
}

/* The scalar parameters, checked in this order, each absent or null = its default. */
enum fkind {
	FK_REAL, /* a number in [lo, hi] into a double */
	FK_INT,	 /* an integer in [lo, hi] into an int */
	FK_SEED, /* an integer in [lo, hi] into seed, setting has_seed */
	FK_BOOL, /* true or false into an int */
};
static const struct field {
	const char *name;
	enum fkind kind;
	double lo, hi;
	size_t off;
} fields[] = {
    {"temperature", FK_REAL, 0, 2, offsetof(struct oai_request, temperature)},
    {"top_p", FK_REAL, 0, 1, offsetof(struct oai_request, top_p)},
    {"top_k", FK_INT, 0, 1000000, offsetof(struct oai_request, top_k)},
    {"seed", FK_SEED, -9.2e18, 9.2e18, offsetof(struct oai_request, seed)},
    {"presence_penalty", FK_REAL, -2, 2, offsetof(struct oai_request, presence_penalty)},
    {"frequency_penalty", FK_REAL, -2, 2, offsetof(struct oai_request, frequency_penalty)},
    {"n", FK_INT, 1, OAI_MAX_CHOICES, offsetof(struct oai_request, n)},
    {"stream", FK_BOOL, 0, 0, offsetof(struct oai_request, stream)},
    {"echo", FK_BOOL, 0, 0, offsetof(struct oai_request, echo)},
};

static int parse_field(const cJSON *o, const struct field *f, struct oai_request *r,
		       const struct perr *e)
{
	char *at = (char *)r + f->off;
	double d;
	int present;
	switch (f->kind) {
	case FK_BOOL:
		return opt_bool(o, f->name, (int *)at) ? bad_type(e, f->name) : 0;
	case FK_REAL:
		return opt_number(o, f->name, f->lo, f->hi, (double *)at, NULL)
			   ? bad_range(e, f->name)
			   : 0;
	case FK_INT:
	case FK_SEED:
		if (opt_number(o, f->name, f->lo, f->hi, &d, &present) ||
		    (present && d != floor(d)))
			return bad_range(e, f->name);
		if (present && f->kind == FK_INT)
			*(int *)at = (int)d;
		if (present && f->kind == FK_SEED) {
			r->has_seed = 1;
			r->seed = (uint64_t)(int64_t)d;
		}
		return 0;
	}
	return 0;
}

/* "stop": a non-empty string, or an array of at most OAI_MAX_STOP of them. */
static int parse_stop(const cJSON *o, struct oai_request *r, const struct perr *e)
{
	static const char *const p = "stop";
	const cJSON *stop = cJSON_GetObjectItemCaseSensitive(o, p);
	if (cJSON_IsString(stop)) {
		if (!*stop->valuestring)
			return bad_range(e, p);
		r->stop[r->n_stop++] = dup_str(stop->valuestring);
	} else if (cJSON_IsArray(stop)) {
		if (cJSON_GetArraySize(stop) > OAI_MAX_STOP)
			return bad_range(e, p);
		const cJSON *s;
		cJSON_ArrayForEach(s, stop)
		{
			if (!cJSON_IsString(s) || !*s->valuestring)
				return bad_type(e, p);
			r->stop[r->n_stop++] = dup_str(s->valuestring);
		}
	} else if (stop && !cJSON_IsNull(stop)) {
		return bad_type(e, p);
	}
	for (int i = 0; i < r->n_stop; i++)
		if (!r->stop[i])
			return -ENOMEM;
	return 0;
}

/* Chat: "logprobs" (bool) and "top_logprobs" (0..20, only with logprobs); completions:
 * "logprobs" (0..5 alternatives). echo with logprobs would need the prompt's, not computed. */
static int parse_logprobs(const cJSON *o, struct oai_request *r, const struct perr *e)
{
	const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
	const cJSON *top = cJSON_GetObjectItemCaseSensitive(o, "top_logprobs");
	int has_top = top && !cJSON_IsNull(top);
	if (r->chat) {
		if (opt_bool(o, "logprobs", &r->logprobs))
			return bad_type(e, "logprobs");
		if (!has_top)
			return 0;
		if (!cJSON_IsNumber(top) || top->valuedouble != floor(top->valuedouble) ||
		    top->valuedouble < 0 || top->valuedouble > OAI_MAX_TOP_LOGPROBS)
			return bad(e, "top_logprobs", -EINVAL,
				   "'top_logprobs' must be an integer between 0 and 20%s", NULL);
		if (!r->logprobs)
			return bad(e, "top_logprobs", -EINVAL,
				   "'top_logprobs' needs 'logprobs': true%s", NULL);
		r->top_logprobs = (int)top->valuedouble;
		return 0;
	}
	if (has_top)
		return bad(
		    e, "top_logprobs", -EINVAL,
		    "'top_logprobs' is a chat parameter: completions take 'logprobs': 0..5%s",
		    NULL);
	if (!lp || cJSON_IsNull(lp))
		return 0;
	if (!cJSON_IsNumber(lp) || lp->valuedouble != floor(lp->valuedouble) ||
	    lp->valuedouble < 0 || lp->valuedouble > 5)
		return bad(e, "logprobs", -EINVAL,
			   "'logprobs' must be an integer between 0 and 5%s", NULL);
	r->logprobs = 1;
	r->top_logprobs = (int)lp->valuedouble;
	if (r->echo)
		return bad(e, "echo", -EINVAL,
			   "'echo' with 'logprobs' (the prompt's log-probabilities) is not "
			   "supported%s",
			   NULL);
	return 0;
}

/* n × prompts choices: at most OAI_MAX_CHOICES; echo needs prompt text. */
static int check_choices(const struct oai_request *r, const struct perr *e)
{
	int np = r->chat ? 1 : r->n_prompts;
	if (r->n * np > OAI_MAX_CHOICES)
		return bad(e, "n", -EINVAL, "'n' times the prompts is more than 16 choices%s",
			   NULL);
	for (int i = 0; !r->chat && r->echo && i < np; i++)
		if (!r->prompts[i].text)
			return bad(e, "echo", -EINVAL,
				   "'echo' needs a text prompt, not token ids%s", NULL);
	return 0;
}

/* "logit_bias": an object of at most OAI_MAX_BIAS "token id": bias, each id a decimal integer
 * >= 0 and each bias a number in [-100, 100]. */
static int parse_logit_bias(const cJSON *o, struct oai_request *r, const struct perr *e)
{
	static const char *const p = "logit_bias";
	const cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, p);
	if (!lb || cJSON_IsNull(lb))
		return 0;
	if (!cJSON_IsObject(lb))
		return bad_type(e, p);
	if (cJSON_GetArraySize(lb) > OAI_MAX_BIAS)
		return bad(e, p, -EINVAL, "'logit_bias' has more than 64 entries%s", NULL);
	const cJSON *v;
	cJSON_ArrayForEach(v, lb)
	{
		const char *k = v->string;
		char *end;
		long id = strtol(k, &end, 10);
		if (!*k || *end || id < 0 || id > INT32_MAX || k[0] == '-' || k[0] == '+' ||
		    k[0] == ' ')
			return bad(e, p, -EINVAL, "'logit_bias' keys must be token ids, not '%s'",
				   k);
		if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < -100 ||
		    v->valuedouble > 100)
			return bad(e, p, -EINVAL,
				   "'logit_bias' values must be numbers in [-100, 100]%s", NULL);
		r->bias[r->n_bias].id = (int32_t)id;
		r->bias[r->n_bias++].bias = v->valuedouble;
	}
	return 0;
}

/* The tenant's cache salt: "cache_salt", else "user"; at most OAI_MAX_SALT bytes. */
static int parse_salt(const cJSON *o, struct oai_request *r, const struct perr *e)
{
	const char *p = "cache_salt";
	if (opt_string(o, p, &r->salt))
		return bad_type(e, p);
	if (!r->salt) {
		p = "user";
		if (opt_string(o, p, &r->salt))
			return bad_type(e, p);
	}
	if (r->salt && strlen(r->salt) > OAI_MAX_SALT)
		return bad(e, p, -EINVAL, "'%s' is longer than 255 bytes", p);
	return 0;
}

/* Parameters OpenAI defines that this server does not implement: present with anything but
 * their neutral value (null, false, 0, "", an empty array or object, or the value listed), a
 * request is refused with a 400 naming the parameter, never answered as if it were absent.
 * neutral: a string value that also means "nothing asked" (service_tier "auto"), or NULL. */
static const struct refused {
	const char *name;
	const char *neutral;
} refused[] = {
    {"tools", NULL},
    {"tool_choice", "none"},
    {"functions", NULL},
    {"function_call", "none"},
    {"parallel_tool_calls", NULL},
    {"response_format", NULL},
    {"service_tier", "auto"},
    {"store", NULL},
    {"metadata", NULL},
    {"modalities", NULL},
    {"audio", NULL},
    {"prediction", NULL},
    {"reasoning_effort", NULL},
    {"web_search_options", NULL},
    {"verbosity", NULL},
    {"suffix", NULL},
    {"best_of", NULL},
};

/* Whether v asks for nothing: null, false, 0, "", [], {}, the entry's neutral string, or
 * best_of 1 and modalities ["text"] (what every request gets anyway). */
static int neutral_value(const struct refused *f, const cJSON *v)
{
	if (cJSON_IsNull(v) || cJSON_IsFalse(v))
		return 1;
	if (cJSON_IsNumber(v))
		return v->valuedouble == 0 ||
		       (strcmp(f->name, "best_of") == 0 && v->valuedouble == 1);
	if (cJSON_IsString(v))
		return !*v->valuestring ||
		       (f->neutral && strcmp(v->valuestring, f->neutral) == 0) ||
		       (strcmp(f->name, "service_tier") == 0 &&
			strcmp(v->valuestring, "default") == 0);
	if (cJSON_IsArray(v) && strcmp(f->name, "modalities") == 0 && cJSON_GetArraySize(v) == 1 &&
	    cJSON_IsString(v->child) && strcmp(v->child->valuestring, "text") == 0)
		return 1;
	return (cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child;
}

static int parse_refused(const cJSON *o, const struct perr *e)
{
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, refused[i].name);
		if (v && !neutral_value(&refused[i], v))
			return bad(e, refused[i].name, -EINVAL,
				   "'%s' is not supported by this server", refused[i].name);
	}
	return 0;
}

/* The request object's members, in the order their errors are reported. */
static int parse_object(const cJSON *o, int chat, const struct oai_limits *lim,
			struct oai_request *r, const struct perr *e)
{
	if (!cJSON_IsObject(o))
		return bad(e, NULL, -EINVAL, "request body must be a JSON object%s", NULL);
	if (opt_string(o, "model", &r->model))
		return bad_type(e, "model");
	size_t bytes = 0;
	const char *urls[OAI_MAX_IMAGES];
	int n_urls = 0;
	int rc = chat ? parse_messages(o, lim, r, &bytes, urls, &n_urls, e)
		      : parse_prompt(o, r, &bytes, e);
	if (rc)
		return rc;
	if (bytes > lim->max_prompt_bytes)
		return bad(e, chat ? "messages" : "prompt", -E2BIG,
			   "prompt is longer than this server allows%s", NULL);
	if ((rc = parse_max_tokens(o, lim, r, e)))
		return rc;
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		if ((rc = parse_field(o, &fields[i], r, e)))
			return rc;
	const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
	if (so && !cJSON_IsNull(so) &&
	    (!cJSON_IsObject(so) || opt_bool(so, "include_usage", &r->include_usage)))
		return bad_type(e, "stream_options");
	if ((rc = parse_stop(o, r, e)))
		return rc;
	if ((rc = parse_refused(o, e)) || (rc = parse_logit_bias(o, r, e)) ||
	    (rc = parse_logprobs(o, r, e)) || (rc = check_choices(r, e)) ||
	    (rc = parse_salt(o, r, e)))
		return rc;
	return n_urls ? decode_images(lim, r, urls, e) : 0;
}

static int cmp_key(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A member name that appears twice in one object, anywhere in the tree, or NULL (also when
 * out of memory: -ENOMEM in *rc). JSON leaves duplicates undefined; cJSON keeps both and its
 * lookups take the first, while other parsers (a proxy, a logger) take the last, so a body
 * whose meaning depends on the reader is refused. Sorting the names makes an object of n
 * members cost n log n, not n^2 (a 1 MiB body holds ~150k members). */
static const char *dup_key(const cJSON *o, int *rc)
{
	int n = 0;
	for (const cJSON *c = o->child; c; c = c->next)
		n++;
	if (cJSON_IsObject(o) && n > 1) {
		const char **names = malloc(sizeof(*names) * (size_t)n);
		if (!names) {
			*rc = -ENOMEM;
			return NULL;
		}
		int i = 0;
		for (const cJSON *c = o->child; c; c = c->next)
			names[i++] = c->string ? c->string : "";
		qsort(names, (size_t)n, sizeof(*names), cmp_key);
		const char *d = NULL;
		for (i = 1; i < n && !d; i++)
			if (!strcmp(names[i - 1], names[i]))
				d = names[i];
		free(names);
		if (d)
			return d;
	}
	for (const cJSON *c = o->child; c; c = c->next) {
		const char *d = dup_key(c, rc);
		if (d || *rc)
			return d;
	}
	return NULL;
}

/* Refuses a body with a duplicate member; its name goes to *param through a per-thread
 * buffer (the cJSON tree is freed before the caller reads it). */
static int check_dups(const cJSON *o, const struct perr *e)
{
	static _Thread_local char name[64];
	int rc = 0;
	const char *d = dup_key(o, &rc);
	if (rc)
		return rc;
	if (!d)
		return 0;
	snprintf(name, sizeof(name), "%s", d);
	return bad(e, name, -EINVAL, "'%s' appears twice in one object", name);
}

int oai_parse_request(const char *body, size_t len, int chat, const struct oai_limits *lim,
		      struct oai_request *r, char *err, size_t errlen, const char **param)
{
	memset(r, 0, sizeof(*r));
	r->chat = chat;
	r->temperature = 1.0;
	r->top_p = 1.0;
	r->n = 1;
	r->max_tokens = lim->default_max_tokens;
	if (param)
		*param = NULL;
	const struct perr e = {err, errlen, param};
	if (!body || len == 0)
		return bad(&e, NULL, -EINVAL, "request body is empty%s", NULL);
	if (memchr(body, 0, len))
		return bad(&e, NULL, -EINVAL, "request body contains a NUL byte%s", NULL);
	/* JSON text is UTF-8 (RFC 8259); cJSON passes other bytes through into the strings. */
	if (!utf8_valid(body, len))
		return bad(&e, NULL, -EINVAL, "request body is not valid UTF-8%s", NULL);
	cJSON *o = cJSON_ParseWithLength(body, len);
	if (!o)
		return bad(&e, NULL, -EINVAL, "request body is not valid JSON%s", NULL);
	int rc = check_dups(o, &e);
	if (!rc)
		rc = parse_object(o, chat, lim, r, &e);
	cJSON_Delete(o);
	if (rc)
		oai_request_free(r);
	return rc;
}

void oai_request_free(struct oai_request *r)
{
	free(r->model);
	for (int i = 0; i < r->n_prompts; i++) {
		free(r->prompts[i].text);
		free(r->prompts[i].toks);
	}
	free(r->prompts);
	for (int i = 0; i < r->n_messages; i++) {
		free(r->messages[i].role);
		free(r->messages[i].content);
		for (int k = 0; k < r->messages[i].n_images; k++)
			img_free(&r->messages[i].images[k].img);
		free(r->messages[i].images);
	}
	free(r->messages);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->salt);
	int chat = r->chat;
	memset(r, 0, sizeof(*r));
	r->chat = chat;
}

struct sbuf {
	char *p;
	size_t len, cap;
	int err;
};

static void sb_put(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);
	if (b->err)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->err = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n + 1);
	b->len += n;
}

/* A message's content with its images' places recorded: the text up to each image, then
 * where the image goes (bytes of *b so far) into off[*k]. */
static void put_content(struct sbuf *b, const struct oai_message *m, size_t *off, int max, int *k)
{
	size_t from = 0, len = strlen(m->content);
	for (int i = 0; i < m->n_images; i++) {
		size_t at = m->images[i].offset < len ? m->images[i].offset : len;
		if (at > from) {
			char *piece = strndup(m->content + from, at - from);
			if (!piece) {
				b->err = 1;
				return;
			}
			sb_put(b, piece);
			free(piece);
			from = at;
		}
		if (off && *k < max)
			off[*k] = b->len;
		(*k)++;
	}
	sb_put(b, m->content + from);
}

int oai_render_chat(const struct oai_request *r, const char *tmpl, char **out)
{
	return oai_render_chat_media(r, tmpl, out, NULL, 0);
}

int oai_render_chat_media(const struct oai_request *r, const char *tmpl, char **out,
			  size_t *image_off, int max)
{
	struct sbuf b = {0};
	int nimg = 0;
	int kind = 0;
	if (!tmpl || strcmp(tmpl, "plain") == 0)
		kind = 0;
	else if (strcmp(tmpl, "chatml") == 0)
		kind = 1;
	else if (strcmp(tmpl, "llama3") == 0)
		kind = 2;
	else
		return -EINVAL;
	for (int i = 0; i < r->n_messages; i++) {
		const struct oai_message *m = &r->messages[i];
		const char *role = strcmp(m->role, "developer") == 0 ? "system" : m->role;
		if (kind == 1) {
			sb_put(&b, "<|im_start|>");
			sb_put(&b, role);
			sb_put(&b, "\n");
			put_content(&b, m, image_off, max, &nimg);
			sb_put(&b, "<|im_end|>\n");
		} else if (kind == 2) {
			sb_put(&b, "<|start_header_id|>");
			sb_put(&b, role);
			sb_put(&b, "<|end_header_id|>\n\n");
			put_content(&b, m, image_off, max, &nimg);
			sb_put(&b, "<|eot_id|>");
		} else {
			char cap[16];
			snprintf(cap, sizeof(cap), "%c%s", role[0] - 32, role + 1);
			sb_put(&b, cap);
			sb_put(&b, ": ");
			put_content(&b, m, image_off, max, &nimg);
			sb_put(&b, "\n");
		}
	}
	sb_put(&b, kind == 1   ? "<|im_start|>assistant\n"
		   : kind == 2 ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
			       : "Assistant:");
	if (b.err) {
		free(b.p);
		return -ENOMEM;
	}
	*out = b.p;
	return 0;
}
