#!/bin/sh
# The quick start in ptrain.h's top comment must equal examples/quickstart.c's
# snippet line for line (so the documented code is the compiled code).
a=$(sed -n '/QUICK START/,/CONFIGURATION MACROS/p' ptrain.h | sed '1,2d;$d' | sed 's/^ *//' | sed '/^$/d')
b=$(sed -n '/---- the snippet from ptrain.h ----/,/---- end of the snippet ----/p' examples/quickstart.c |
    sed '1d;$d' | sed 's/^ *//' | sed '/^$/d')
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "quick start differs:"; echo "$a" > /tmp/snip_a.$$; echo "$b" > /tmp/snip_b.$$; diff /tmp/snip_a.$$ /tmp/snip_b.$$; rm -f /tmp/snip_a.$$ /tmp/snip_b.$$; exit 1; }
echo "quick start snippet: $(echo "$a" | wc -l) lines identical"
