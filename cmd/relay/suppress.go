package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/service"
)

const suppressUsage = `the suppression list (docs/consent.md):
  relay suppress add -reason R [-by NAME] NUMBER...   put numbers on the list: no provider is called for them
  relay suppress remove -reason R [-by NAME] NUMBER   take a number off the list (who and why are recorded)
  relay suppress list [-limit N] [-after SEQ]         the list, numbers masked, a page at a time
  relay suppress check NUMBER                         whether a number is on the list, since when and why
  relay suppress import [-reason R] [-by NAME] [-batch N] FILE.csv
                                                      add the numbers of a CSV file: lines "number[,reason]"
NUMBER is E.164 ("+15551234567"). -by defaults to the operating system's
user. The output never shows a number whole.`

// Bounds of the suppression commands.
const (
	defaultImportBatch = 1000
	maxImportBatch     = 10000
	maxBadLinesShown   = 20
)

type suppressConfig struct {
	db          service.Database
	reason, by  string
	limit       int
	after       int64
	batch       int
	currentUser func() string
}

func runSuppress(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, suppressUsage)
		return 2
	}
	verb, args := args[0], args[1:]
	switch verb {
	case "add", "remove", "list", "check", "import":
	default:
		fmt.Fprintf(stderr, "relay suppress: unknown command %q\n%s\n", verb, suppressUsage)
		return 2
	}
	c := suppressConfig{currentUser: func() string { return osUser(getenv) }}
	s := envflag.New("relay suppress "+verb, getenv, stderr)
	service.BindDatabase(s, &c.db)
	fs := s.FlagSet()
	switch verb {
	case "add", "remove", "import":
		fs.StringVar(&c.reason, "reason", "", "why (recorded; required to add or remove one number; an import's lines may give their own)")
		fs.StringVar(&c.by, "by", "", "who (recorded); default: the operating system's user")
	case "list":
		fs.IntVar(&c.limit, "limit", defaultListLimit, fmt.Sprintf("entries on a page (at most %d)", maxListLimit))
		fs.Int64Var(&c.after, "after", 0, "only entries after this one (the cursor a list prints for its next page)")
	}
	if verb == "import" {
		fs.IntVar(&c.batch, "batch", defaultImportBatch, fmt.Sprintf("numbers per transaction (at most %d)", maxImportBatch))
	}
	if err := s.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, suppressUsage)
			return 0
		}
		fmt.Fprintf(stderr, "relay suppress %s: %v\n", verb, err)
		return 2
	}
	var err error
	switch verb {
	case "add":
		err = suppressAdd(ctx, c, fs.Args(), stdout)
	case "remove":
		err = suppressRemove(ctx, c, fs.Args(), stdout)
	case "list":
		err = suppressList(ctx, c, fs.Args(), stdout)
	case "check":
		err = suppressCheck(ctx, c, fs.Args(), stdout)
	case "import":
		err = suppressImport(ctx, c, fs.Args(), stdout)
	}
	var usage usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(stderr, "relay suppress %s: %v\n%s\n", verb, err, suppressUsage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay suppress %s: %v\n", verb, err)
		return 1
	}
	return 0
}

// osUser names the operator: the operating system's user, else $USER.
func osUser(getenv func(string) string) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return getenv("USER")
}

func (c suppressConfig) who() string {
	if c.by != "" {
		return c.by
	}
	return c.currentUser()
}

// numbers checks that args are E.164 numbers, naming a bad one by its
// place only.
func numbers(args []string) ([]string, error) {
	for i, a := range args {
		if !outbox.ValidNumber(a) {
			return nil, usageError{fmt.Errorf("argument %d is not an E.164 number (\"+\" and 2 to 15 digits, the first not 0)", i+1)}
		}
	}
	return args, nil
}

func suppressAdd(ctx context.Context, c suppressConfig, args []string, out io.Writer) error {
	nums, err := numbers(args)
	switch {
	case err != nil:
		return err
	case len(nums) == 0:
		return usageError{errors.New("give one or more numbers")}
	case strings.TrimSpace(c.reason) == "":
		return usageError{errors.New("-reason is required")}
	case c.who() == "":
		return usageError{errors.New("-by is required (the operating system's user could not be read)")}
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n, err := outbox.SuppressNumbers(ctx, conn, nums, outbox.SourceOperator, c.reason, c.who())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d added, %d already on the list\n", n, int64(len(distinct(nums)))-n)
	return nil
}

func suppressRemove(ctx context.Context, c suppressConfig, args []string, out io.Writer) error {
	nums, err := numbers(args)
	switch {
	case err != nil:
		return err
	case len(nums) != 1:
		return usageError{errors.New("give one number")}
	case strings.TrimSpace(c.reason) == "":
		return usageError{errors.New("-reason is required: a removal is recorded with who and why")}
	case c.who() == "":
		return usageError{errors.New("-by is required (the operating system's user could not be read)")}
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ok, err := outbox.Unsuppress(ctx, conn, nums[0], c.who(), c.reason)
	if err != nil {
		return err
	}
	if !ok {
		fmt.Fprintf(out, "%s was not on the list\n", outbox.MaskPhone(nums[0]))
		return nil
	}
	fmt.Fprintf(out, "%s removed by %s: messages to it are sent again\n", outbox.MaskPhone(nums[0]), c.who())
	return nil
}

func suppressList(ctx context.Context, c suppressConfig, args []string, out io.Writer) error {
	switch {
	case len(args) != 0:
		return usageError{errors.New("list takes no arguments")}
	case c.limit <= 0 || c.limit > maxListLimit:
		return usageError{fmt.Errorf("-limit %d: want 1 to %d", c.limit, maxListLimit)}
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	entries, next, err := outbox.Suppressions(ctx, conn, c.after, c.limit)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tADDED\tNUMBER\tSOURCE\tPROVIDER\tBY\tREASON")
	for _, e := range entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, ts(e.At), e.NumberMasked, e.Source, dash(e.Provider), dash(e.By), dash(e.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d entries\n", len(entries))
	if next != 0 {
		fmt.Fprintf(out, "more: the next page is -after %d\n", next)
	}
	return nil
}

func suppressCheck(ctx context.Context, c suppressConfig, args []string, out io.Writer) error {
	nums, err := numbers(args)
	switch {
	case err != nil:
		return err
	case len(nums) != 1:
		return usageError{errors.New("give one number")}
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	e, removals, err := outbox.CheckSuppression(ctx, conn, nums[0])
	if err != nil {
		return err
	}
	masked := outbox.MaskPhone(nums[0])
	if e == nil {
		fmt.Fprintf(out, "%s is not on the suppression list: messages to it are sent\n", masked)
	} else {
		fmt.Fprintf(out, "%s is on the suppression list: no provider is called for it\n  source  %s\n", masked, e.Describe())
	}
	for _, r := range removals {
		fmt.Fprintf(out, "  removed %s by %s (%s): %s; it had been added as %s\n", ts(r.At), r.By, r.Via, r.Reason, r.Added.Describe())
	}
	return nil
}

// suppressImport adds the numbers of a CSV file, -batch a transaction,
// each line "number[,reason]" (a line's reason, else -reason); a header
// line "number,..." and lines starting "#" are skipped. A line whose number
// is not E.164 is reported by its line number, never its content, and
// skipped. Numbers already on the list are left as they are, so an import
// run again adds nothing twice.
func suppressImport(ctx context.Context, c suppressConfig, args []string, out io.Writer) error {
	switch {
	case len(args) != 1:
		return usageError{errors.New("give one CSV file (- for the standard input)")}
	case c.batch <= 0 || c.batch > maxImportBatch:
		return usageError{fmt.Errorf("-batch %d: want 1 to %d", c.batch, maxImportBatch)}
	case c.who() == "":
		return usageError{errors.New("-by is required (the operating system's user could not be read)")}
	}
	var in io.Reader = os.Stdin
	if args[0] != "-" {
		f, err := os.Open(args[0])
		if err != nil {
			return fmt.Errorf("open the CSV file: %w", err)
		}
		defer f.Close()
		in = f
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	r := csv.NewReader(bufio.NewReader(in))
	r.FieldsPerRecord, r.Comment, r.TrimLeadingSpace, r.ReuseRecord = -1, '#', true, true
	var (
		lines, valid, added int64
		bad                 []int
		batch               = map[string][]string{} // reason -> numbers
		inBatch             int
	)
	flush := func() error {
		for reason, nums := range batch {
			n, err := outbox.SuppressNumbers(ctx, conn, nums, outbox.SourceImport, reason, c.who())
			if err != nil {
				return err
			}
			added += n
		}
		clear(batch)
		inBatch = 0
		return nil
	}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line, _ := r.FieldPos(0)
		if err != nil {
			var perr *csv.ParseError
			if errors.As(err, &perr) {
				// The parser's error quotes nothing of the line, but
				// say only where.
				return fmt.Errorf("line %d: the file is not CSV", perr.Line)
			}
			return fmt.Errorf("read the CSV file: %w", err)
		}
		lines++
		num := strings.TrimSpace(rec[0])
		if lines == 1 && strings.EqualFold(num, "number") {
			continue // a header
		}
		if num == "" && len(rec) == 1 {
			continue
		}
		if !outbox.ValidNumber(num) {
			bad = append(bad, line)
			continue
		}
		reason := c.reason
		if len(rec) > 1 && strings.TrimSpace(rec[1]) != "" {
			reason = strings.TrimSpace(rec[1])
		}
		if reason == "" {
			reason = "imported"
		}
		valid++
		batch[reason] = append(batch[reason], num)
		if inBatch++; inBatch >= c.batch {
			if err := flush(); err != nil {
				return fmt.Errorf("after %d numbers: %w", valid-int64(inBatch), err)
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if err := outbox.AnalyzeSuppressions(ctx, conn); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d numbers read: %d added, %d already on the list; %d lines refused\n", valid, added, valid-added, len(bad))
	if len(bad) > 0 {
		shown := bad[:min(len(bad), maxBadLinesShown)]
		s := make([]string, len(shown))
		for i, l := range shown {
			s[i] = fmt.Sprint(l)
		}
		more := ""
		if len(bad) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(bad)-len(shown))
		}
		fmt.Fprintf(out, "not an E.164 number (\"+\" and 2 to 15 digits, the first not 0) on line %s%s: fix them and import again (nothing is added twice)\n",
			strings.Join(s, ", "), more)
		return errors.New("some lines were refused")
	}
	return nil
}

// distinct returns ss without repeats.
func distinct(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
