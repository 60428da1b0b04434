#!/usr/bin/perl
# cu2cc.pl IN.cu OUT.cc — rewrites a CUDA source for kvk_emu (kvk_emu.h): the two constructs
# that are not C++ become calls of the emulator, everything else stays as written, line for
# line (so compiler messages and sanitizer reports point into IN.cu):
#   k<<<grid, block[, smem[, stream]]>>>(args)  ->  kvk_emu_launch("k", kvk_emu_config(...), k, args)
#   extern __shared__ T name[];                 ->  T *name = (T *)kvk_emu_dyn_smem();
#   __shared__ T name[dims];                    ->  KVK_EMU_SHARED(T, name, [dims]);
# Any other use of __shared__ (an initialiser, several names in one declaration, an alignment
# attribute) is refused: the emulator would not place it in the block's shared memory.
use strict;
use warnings;

die "usage: cu2cc.pl IN.cu OUT.cc\n" unless @ARGV == 2;
my ($in, $out) = @ARGV;
open(my $fh, '<', $in) or die "cu2cc: $in: $!\n";
my $s = do { local $/; <$fh> };
close($fh);

my $n_smem = ($s =~ s/extern\s+__shared__\s+([A-Za-z_][\w\s\*]*?)\s*\b(\w+)\s*\[\s*\]\s*;/$1 *$2 = ($1 *)kvk_emu_dyn_smem();/g) || 0;

# A kernel name, optionally with template arguments, then <<<config>>>, then the argument
# list's opening parenthesis. Whitespace (newlines) is kept where it was.
# Static shared memory: a reference into the block's static shared memory (kvk_emu.h).
# Static shared memory: a reference into the block's static shared memory (kvk_emu.h). On one
# line only, so the output keeps the input's lines.
my $n_static = ($s =~ s/(?<!\w)__shared__[ \t]+([A-Za-z_][\w \t\*]*?)[ \t]*\b(\w+)[ \t]*((?:\[[^\[\];\n]*\][ \t]*)*);/"KVK_EMU_SHARED($1, $2, " . ($3 =~ s|[ \t]+$||r) . ");"/ge) || 0;
(my $code = $s) =~ s{//[^\n]*|/\*.*?\*/}{}gs;
die "cu2cc: $in: a '__shared__' is left that is not a declaration this script understands\n"
    if $code =~ /\b__shared__\b/;

my $n_launch = ($s =~ s{([A-Za-z_]\w*(?:<[^<>;()]*>)?)(\s*)<<<(.*?)>>>(\s*)\((\s*\))?}{
	my ($k, $w1, $cfg, $w2, $empty) = ($1, $2, $3, $4, $5);
	"kvk_emu_launch(\"$k\",$w1 kvk_emu_config($cfg),$w2 $k" . (defined $empty ? ")" : ", ");
}gse) || 0;

die "cu2cc: $in: a '<<<' is left that is not a launch this script understands\n" if $s =~ /<<</;

open(my $oh, '>', "$out.tmp") or die "cu2cc: $out: $!\n";
print $oh "#line 1 \"$in\"\n", $s;
close($oh) or die "cu2cc: $out: $!\n";
rename("$out.tmp", $out) or die "cu2cc: $out: $!\n";
