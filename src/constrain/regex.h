#pragma once
// The regular-expression subset of JSON Schema `pattern` (and of the `format` grammars), compiled to a grammar that
// writes one matching string. Semantics are Python's re.search (what the jsonschema package checks): a pattern
// matches anywhere unless anchored, so an unanchored side gets any characters.
//
// Supported: literal characters (UTF-8), escapes \. \\ \/ \- etc., \n \t \r \f \v, \uXXXX, \xXX; classes [...] and
// [^...] with ranges; \d \w \s (ASCII: [0-9], [A-Za-z0-9_], [ \t\n\r\f\v]) and \D \W \S (their complements within
// ASCII, \S also without \x1c-\x1f, which Python's \s matches: a subset of Python's Unicode meaning, so every
// output matches); `.` (any character but \n); groups ( ) and
// (?: ); alternation |; quantifiers * + ? {n} {n,} {n,m} (greedy only; a bound at most 1000); anchors ^ at the start
// and $ at the end of a top-level alternative. Anything else (backreferences, lookaround, lazy quantifiers, \b,
// named groups, flags) is a qs::Error naming what was found.
#include <string_view>

#include "constrain/char_classes.h"
#include "constrain/grammar.h"

namespace qs {

// The node writing one string that re.search(pattern, string) accepts; each character written through `write`.
GrammarBuilder::Node compile_pattern(GrammarBuilder& g, std::string_view pattern, const CharWriter& write);

}  // namespace qs
