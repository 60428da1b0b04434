/* Tests for engine/kvb: block hashes against vectors computed by an independent
 * implementation (Python hashlib, docs/kv-block-format.md), header round-trip, and every
 * header check that turns a wrong or damaged block file into a miss. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvb.h"

#include <openssl/evp.h>

static void hex(const uint8_t *b, char *out)
{
	kvb_hex(b, KVB_HASH, out);
}

static const struct kvb_geom G = {
    .n_layer = 2, .n_head_kv = 2, .head_dim = 16, .dtype = KVB_DTYPE_F16, .block_tokens = 4};

static void test_vectors(void **state)
{
	(void)state;
	uint8_t mfp[32], fp[32], sd[32], h[2][32];
	char s[65];
	for (int i = 0; i < 32; i++)
		mfp[i] = (uint8_t)i;
	kvb_fingerprint(mfp, &G, fp);
	hex(fp, s);
	assert_string_equal(s, "43f8f18f669c0e72d795d7682f4b51250c633ed1b95de5c7cecf36fb155d3a10");
	int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	kvb_salt_digest("", sd);
	hex(sd, s);
	assert_string_equal(s, "f01d421637fff748dacd8b155cd3e416abe4b18ff887af52a9dbe336884a8ccb");
	assert_int_equal(kvb_chain(fp, sd, ids, 8, 4, h, 2), 2);
	hex(h[0], s);
	assert_string_equal(s, "773ecfe704f3987fb2c0750685f85cf62f9ffc9e4e06c9a58339f69ed243fd94");
	hex(h[1], s);
	assert_string_equal(s, "8f9b7576d9ff12a135ccc6c9f12050db223c42fe84e07ed5cac2259af023bddc");

	kvb_salt_digest("tenant-a", sd);
	assert_int_equal(kvb_chain(fp, sd, ids, 9, 4, h, 8), 2); /* a partial block is not hashed */
	hex(h[0], s);
	assert_string_equal(s, "45f88f5a4248747f7273c7de5ecc499930e50a1b4f20bb39b7eaa8c87d0ffbc2");
	hex(h[1], s);
	assert_string_equal(s, "bfaf8691aa813fba34072687491b6344200b45f38cee9bee57bd4b43eb6a4187");

	/* Changing the geometry changes the fingerprint. */
	struct kvb_geom g2 = G;
	g2.block_tokens = 8;
	uint8_t fp2[32];
	kvb_fingerprint(mfp, &g2, fp2);
	assert_memory_not_equal(fp, fp2, 32);

	char path[160];
	assert_int_equal(kvb_path(fp, h[0], path, sizeof(path)), 0);
	assert_int_equal(strlen(path), 64 + 1 + 2 + 1 + 64 + 4);
	assert_memory_equal(path + 65, "45/45f88f5a", 11);
}

struct fixture {
	uint8_t fp[32], sd[32], h[2][32];
	int32_t ids[8];
	uint8_t hdr[KVB_HEADER_SIZE];
	uint8_t *payload;
	uint64_t plen;
	struct kvb_header out;
};

static void make(struct fixture *f)
{
	memset(f, 0, sizeof(*f));
	for (int i = 0; i < 32; i++)
		f->fp[i] = (uint8_t)(i * 7);
	kvb_salt_digest(NULL, f->sd);
	for (int i = 0; i < 8; i++)
		f->ids[i] = 1000 + i * 13;
	kvb_chain(f->fp, f->sd, f->ids, 8, 4, f->h, 2);
	f->plen = kvb_payload_bytes(&G);
	assert_int_equal(f->plen, 2 * 2 * 4 * 2 * 16 * 2);
	f->payload = malloc(f->plen);
	for (uint64_t i = 0; i < f->plen; i++)
		f->payload[i] = (uint8_t)(i * 31 + 7);
	static struct kvb_header h;
	memset(&h, 0, sizeof(h));
	memcpy(h.fingerprint, f->fp, 32);
	memcpy(h.hash, f->h[1], 32);
	memcpy(h.parent, f->h[0], 32);
	h.geom = G;
	h.ntokens = 4;
	h.payload_bytes = f->plen;
	h.payload_crc = kvb_payload_crc(f->payload, f->plen);
	memcpy(h.tokens, f->ids + 4, 4 * sizeof(int32_t));
	assert_int_equal(kvb_header_write(&h, f->hdr), 0);
}

static int check(struct fixture *f)
{
	return kvb_header_check(f->hdr, f->fp, f->h[1], f->h[0], &G, f->ids + 4, 4,
				KVB_HEADER_SIZE + f->plen, &f->out);
}

/* Blocks after an image are named by its pixels' hash (vectors from the Python in
 * docs/kv-block-format.md, "Images"): another image with the same placeholder ids gets other
 * names from the first block it touches on, and a prompt without images keeps the text-only
 * names. */
static void test_image_vectors(void **state)
{
	(void)state;
	uint8_t mfp[32], fp[32], sd[32], h[3][32], t[3][32];
	char s[65];
	for (int i = 0; i < 32; i++)
		mfp[i] = (uint8_t)i;
	kvb_fingerprint(mfp, &G, fp);
	kvb_salt_digest("", sd);
	int32_t ids[12] = {1, 9, 9, 9, 9, 9, 7, 8, 2, 3, 4, 5};
	struct kvb_image im = {.pos = 1, .n = 5};
	/* SHA-256("image a") and ("image b"), as the tests' image hashes */
	static const char *want[2][3] = {
	    {"86bc7ad7020642823f47311f902dfd37b36a329aaef33ccf6aadcf5b4fc4f357",
	     "f4af3009b1f04bb9081f7b804f2ef8cfa13c1359af1c8398844fb8e4d762a74e",
	     "9871e1613521d93327a2eb632f5228065d0d1669a59baad011d95c5ce562e073"},
	    {"522e633dabc35d26a9452ce9161de512d7a8609db3d4d20b9782ba0bc8db5626",
	     "8a8198441f83f67f98e8ea9fc0c5a135228b7fb249fdb08ea5e30bedc5ca4558",
	     "cee4879e7ae31eabd42daced45a1c005e0ab64632bb077983026926b48ac1952"}};
	static const char *name[2] = {"image a", "image b"};
	for (int k = 0; k < 2; k++) {
		EVP_Digest(name[k], strlen(name[k]), im.hash, NULL, EVP_sha256(), NULL);
		assert_int_equal(kvb_chain_images(fp, sd, ids, 12, 4, &im, 1, h, 3), 3);
		for (int i = 0; i < 3; i++) {
			hex(h[i], s);
			assert_string_equal(s, want[k][i]);
		}
	}
	/* no image: the text-only chain */
	assert_int_equal(kvb_chain_images(fp, sd, ids, 12, 4, NULL, 0, h, 3), 3);
	assert_int_equal(kvb_chain(fp, sd, ids, 12, 4, t, 3), 3);
	assert_memory_equal(h, t, sizeof(h));
	/* an image only in the last block leaves the first two as text */
	im.pos = 9;
	im.n = 2;
	assert_int_equal(kvb_chain_images(fp, sd, ids, 12, 4, &im, 1, h, 3), 3);
	assert_memory_equal(h, t, 2 * 32);
	assert_memory_not_equal(h[2], t[2], 32);
	/* bad spans */
	struct kvb_image two[2] = {{.pos = 1, .n = 4}, {.pos = 4, .n = 2}};
	assert_int_equal(kvb_chain_images(fp, sd, ids, 12, 4, two, 2, h, 3), -EINVAL);
	two[1].pos = 5;
	assert_int_equal(kvb_chain_images(fp, sd, ids, 12, 4, two, 2, h, 3), 3);
	two[1].pos = 11; /* runs past the prompt */
	assert_int_equal(kvb_chain_images(fp, sd, ids, 12, 4, two, 2, h, 3), -EINVAL);
	two[1].pos = 6;
	two[1].n = 0;
	assert_int_equal(kvb_chain_images(fp, sd, ids, 12, 4, two, 2, h, 3), -EINVAL);
}

static void test_header_checks(void **state)
{
	(void)state;
	struct fixture f;
	make(&f);
	assert_int_equal(check(&f), 0);
	assert_int_equal(kvb_payload_check(&f.out, f.payload, f.plen), 0);
	assert_int_equal(f.out.tokens[3], f.ids[7]);

	/* Every single-byte corruption of the meaningful header area is caught by the CRC. */
	for (int off = 0; off < 144 + 16; off++) {
		f.hdr[off] ^= 0x20;
		assert_int_not_equal(check(&f), 0);
		f.hdr[off] ^= 0x20;
	}
	/* Even in the zero padding. */
	f.hdr[4000] = 1;
	assert_int_equal(check(&f), -EBADMSG);
	f.hdr[4000] = 0;

	/* Wrong expectations: other model, other block, other parent, other tokens, truncated. */
	uint8_t other[32];
	memset(other, 0x55, 32);
	assert_int_equal(
	    kvb_header_check(f.hdr, other, f.h[1], f.h[0], &G, f.ids + 4, 4, 0, &f.out),
	    KVB_E_OTHER_MODEL);
	assert_int_equal(kvb_header_check(f.hdr, f.fp, f.h[0], f.h[0], &G, f.ids + 4, 4, 0, &f.out),
			 KVB_E_NOT_THIS);
	assert_int_equal(kvb_header_check(f.hdr, f.fp, f.h[1], NULL, &G, f.ids + 4, 4, 0, &f.out),
			 KVB_E_NOT_THIS);
	int32_t bad[4] = {f.ids[4], f.ids[5], f.ids[6], 1};
	assert_int_equal(kvb_header_check(f.hdr, f.fp, f.h[1], f.h[0], &G, bad, 4, 0, &f.out),
			 KVB_E_NOT_THIS);
	assert_int_equal(kvb_header_check(f.hdr, f.fp, f.h[1], f.h[0], &G, f.ids + 4, 3, 0, &f.out),
			 KVB_E_NOT_THIS);
	struct kvb_geom g2 = G;
	g2.head_dim = 8;
	assert_int_equal(
	    kvb_header_check(f.hdr, f.fp, f.h[1], f.h[0], &g2, f.ids + 4, 4, 0, &f.out),
	    KVB_E_OTHER_MODEL);
	assert_int_equal(kvb_header_check(f.hdr, f.fp, f.h[1], f.h[0], &G, f.ids + 4, 4,
					  KVB_HEADER_SIZE + f.plen - 1, &f.out),
			 -EIO);
	/* Payload damage. */
	assert_int_equal(check(&f), 0);
	f.payload[17] ^= 1;
	assert_int_equal(kvb_payload_check(&f.out, f.payload, f.plen), -EBADMSG);
	assert_int_equal(kvb_payload_check(&f.out, f.payload, f.plen - 1), -EBADMSG);
	/* Garbage. */
	memset(f.hdr, 0xAB, sizeof(f.hdr));
	assert_int_equal(check(&f), -EBADMSG);
	free(f.payload);
}

static void test_write_rejects(void **state)
{
	(void)state;
	struct kvb_header h;
	memset(&h, 0, sizeof(h));
	h.geom = G;
	h.ntokens = 5; /* > B */
	h.payload_bytes = kvb_payload_bytes(&G);
	uint8_t buf[KVB_HEADER_SIZE];
	assert_int_equal(kvb_header_write(&h, buf), -EINVAL);
	h.ntokens = 4;
	h.payload_bytes++;
	assert_int_equal(kvb_header_write(&h, buf), -EINVAL);
	h.payload_bytes--;
	h.geom.block_tokens = KVB_MAX_TOKENS + 1;
	assert_int_equal(kvb_header_write(&h, buf), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_vectors),
	    cmocka_unit_test(test_image_vectors),
	    cmocka_unit_test(test_header_checks),
	    cmocka_unit_test(test_write_rejects),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
