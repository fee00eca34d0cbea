// A small deterministic byte-level BPE trainer for the project's test packs (`make-pack --preset tiny`).
//
// train_tiny_bpe(corpus, n_merges, specials):
//  - tokens 0..255 are the single bytes (id = byte value), spelled in the GPT-2 byte alphabet;
//  - the corpus is NFC-normalised and split with the qwen35 pre-tokenizer; pair counts are taken over the
//    distinct pieces weighted by their frequency;
//  - each step merges the most frequent adjacent pair (ties: the smaller (left id, right id)), applied
//    left to right without overlap in every piece, until n_merges merges are made or no pair occurs twice;
//    a merge whose result already exists as a token reuses that token;
//  - then the specials are appended in order: a text found in qwen35_added_tokens() takes its type from
//    there (special -> Control, else UserDefined), others are Control when spelled <|...|>, else
//    UserDefined;
//  - eos = <|im_end|> (else <|endoftext|>), pad = <|endoftext|>, pre = "qwen35", no BOS.
// The same inputs always give the same Vocabulary, byte for byte.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocabulary.h"

namespace bonsai {

Vocabulary train_tiny_bpe(const std::string& corpus, int n_merges, const std::vector<std::string>& specials);

// The built-in training text (English prose, code, chat transcripts, several scripts), ~19 KB.
std::string_view tiny_bpe_corpus();

// train_tiny_bpe(tiny_bpe_corpus(), n_merges, qwen35_added_token_texts()). The built-in corpus has
// 1,378 pairs that occur at least twice, so n_merges above that gives 1,378 merges (vocabulary 1,667).
// 1200 -> 256 bytes + 1200 merges + 33 added tokens = 1,489 tokens.
Vocabulary tiny_vocabulary(int n_merges = 1200);

}  // namespace bonsai
