//! The rewrite of named parameters into positional ones, on the statements that break naive
//! rewrites: casts, slices, literals, comments, dollar quotes; and by property over any text.

use super::*;
use proptest::prelude::*;

const KNOWN: &str = ":data_interval_start, :data_interval_end, :ds, :next_ds, :ds_nodash";

/// The rewritten statement, or the panic message naming the input.
fn sql(input: &str) -> String {
    positional(input)
        .unwrap_or_else(|e| panic!("{input:?}: {e:?}"))
        .sql
}

/// The input unchanged: nothing in it is a parameter.
fn unchanged(input: &str) {
    assert_eq!(
        positional(input),
        Ok(Positional {
            sql: input.to_string(),
            params: vec![],
        }),
        "{input:?}"
    );
}

fn err(input: &str) -> ParamError {
    positional(input).expect_err(input)
}

/// Each `$k` of the output (`k` counted from `first`) back as its name: the input again,
/// when the input itself has no `$` followed by a digit.
fn named(p: &Positional, first: usize) -> String {
    let mut out = String::new();
    let mut rest = p.sql.as_str();
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let digits = rest[i + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - i - 1);
        if digits == 0 {
            out.push('$');
        } else {
            let k: usize = rest[i + 1..i + 1 + digits].parse().unwrap();
            out.push_str(p.params[k - first].name());
        }
        rest = &rest[i + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// The distinct numbers `$k` in a statement.
fn numbers(sql: &str) -> std::collections::BTreeSet<usize> {
    let mut found = std::collections::BTreeSet::new();
    for (i, _) in sql.match_indices('$') {
        let digits: String = sql[i + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(k) = digits.parse() {
            found.insert(k);
        }
    }
    found
}

fn has_positional(input: &str) -> bool {
    input
        .as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && w[1].is_ascii_digit())
}

#[test]
fn a_parameter_right_after_a_word_stays_a_parameter() {
    let p = positional("SELECT:ds, CASE WHEN x THEN:next_ds END").unwrap();
    assert_eq!(p.sql, "SELECT $1, CASE WHEN x THEN $2 END");
}

#[test]
fn names_and_types() {
    let table: Vec<_> = Param::ALL.map(|p| (p.name(), p.pg_type())).into();
    assert_eq!(
        table,
        [
            (":data_interval_start", "timestamptz"),
            (":data_interval_end", "timestamptz"),
            (":ds", "date"),
            (":next_ds", "date"),
            (":ds_nodash", "text"),
        ]
    );
    for p in Param::ALL {
        assert_eq!(Param::from_name(p.name()), Some(p));
    }
    assert_eq!(Param::from_name("ds"), None);
    assert_eq!(Param::from_name(":DS"), None);
}

#[test]
fn every_parameter_becomes_a_number_in_order_of_first_use() {
    let got = positional(
        "SELECT * FROM t WHERE ts >= :data_interval_start AND ts < :data_interval_end \
         AND d BETWEEN :ds AND :next_ds AND s = :ds_nodash",
    )
    .unwrap();
    assert_eq!(
        got.sql,
        "SELECT * FROM t WHERE ts >= $1 AND ts < $2 AND d BETWEEN $3 AND $4 AND s = $5"
    );
    assert_eq!(got.params, Param::ALL);
}

#[test]
fn repeated_names_share_a_number() {
    let got = positional(":next_ds, :ds, :next_ds, :ds,:ds").unwrap();
    assert_eq!(got.sql, "$1, $2, $1, $2,$2");
    assert_eq!(got.params, [Param::NextDs, Param::Ds]);
}

#[test]
fn numbering_starts_at_first() {
    let got = positional_from("x = :ds AND y = :next_ds OR z = :ds", 3).unwrap();
    assert_eq!(got.sql, "x = $3 AND y = $4 OR z = $3");
    assert_eq!(got.params, [Param::Ds, Param::NextDs]);
    assert_eq!(positional("a :ds"), positional_from("a :ds", 1));
    assert_eq!(positional_from("no params", 7).unwrap().sql, "no params");
}

#[test]
fn a_number_past_usize_max_is_an_error_not_a_panic() {
    let max = usize::MAX;
    assert_eq!(positional_from(":ds", max).unwrap().sql, format!("${max}"));
    let e = positional_from(":ds, :next_ds", max).unwrap_err();
    assert_eq!(e.offset, 5);
    assert!(e.message.contains("too large"), "{e}");
}

#[test]
fn casts_are_not_parameters() {
    assert_eq!(sql(":ds::date"), "$1::date");
    assert_eq!(sql("(:ds)::date + 1"), "($1)::date + 1");
    assert_eq!(sql("x::text = :ds_nodash"), "x::text = $1");
    unchanged("x::text");
    unchanged("'2026-01-01'::date");
    unchanged("x::timestamptz::date");
    unchanged("x :: date");
    unchanged("x:::ds");
    unchanged("x::::ds");
    assert_eq!(sql(":ds:: date"), "$1:: date");
}

#[test]
fn colons_that_start_no_name_stay() {
    unchanged("f(a := 1, b => 2)");
    unchanged("SELECT :1, : ds, ':'");
    unchanged("x:");
    unchanged(":");
    unchanged("data ? 'key' AND data ?| array['a']");
}

#[test]
fn string_literals_are_text() {
    unchanged("'a:ds'");
    unchanged("'it''s :ds'");
    unchanged("'' || ':ds' || ''''");
    assert_eq!(sql("'it''s' || :ds || 'x:ds'"), "'it''s' || $1 || 'x:ds'");
    unchanged("U&':ds' N':ds' B'01' X':ds'");
    unchanged("'$1' || '$$'");
}

#[test]
fn escape_strings_use_backslashes() {
    unchanged(r"E'\':ds'");
    unchanged(r"e'\' :ds'");
    unchanged(r"E'\\'':ds'");
    assert_eq!(sql(r"E'\\' || :ds"), r"E'\\' || $1");
    assert_eq!(sql(r"E'a\'b' = :ds"), r"E'a\'b' = $1");
    // Not an E-string: the `e` ends an identifier, or is part of a number.
    assert_eq!(sql(r"some'\' || :ds || '\'"), r"some'\' || $1 || '\'");
    assert_eq!(sql(r"xE'\' :ds"), r"xE'\' $1");
    assert_eq!(sql(r"1e'\' :ds"), r"1e'\' $1");
}

#[test]
fn quoted_identifiers_are_text() {
    unchanged(r#""col:ds""#);
    unchanged(r#""a"":ds""#);
    assert_eq!(sql(r#""a""b" = :ds"#), r#""a""b" = $1"#);
    assert_eq!(sql(r#""x'" = :ds"#), r#""x'" = $1"#);
}

#[test]
fn line_comments_are_text_to_the_end_of_the_line() {
    assert_eq!(sql("-- :ds\n:ds"), "-- :ds\n$1");
    assert_eq!(sql("-- :ds\r:ds"), "-- :ds\r$1");
    assert_eq!(sql("x -- ' :ds\n= :ds -- :dss"), "x -- ' :ds\n= $1 -- :dss");
    unchanged("-- :ds");
    assert_eq!(sql("1 - -:ds"), "1 - -$1");
}

#[test]
fn block_comments_nest() {
    unchanged("/* :ds */");
    assert_eq!(sql("/* /* :ds */ :ds */ :ds"), "/* /* :ds */ :ds */ $1");
    assert_eq!(sql("/* ' */ :ds /* \" */"), "/* ' */ $1 /* \" */");
    assert_eq!(sql("/**/:ds/***/"), "/**/$1/***/");
    assert_eq!(sql("/*/ :ds */ :ds"), "/*/ :ds */ $1");
    assert_eq!(sql("a/:ds"), "a/$1");
}

#[test]
fn dollar_quotes_are_text() {
    unchanged("$$ :ds $$");
    unchanged("$fn$ :ds $fn$");
    unchanged("$fn$ $$ :ds $$ $fn$");
    unchanged("$_1é$ :ds '$1 $_1é$");
    assert_eq!(sql("$$ :ds $$ || :ds"), "$$ :ds $$ || $1");
    assert_eq!(sql("$a$ :ds $b$ :ds $a$ :ds"), "$a$ :ds $b$ :ds $a$ $1");
    // A closing tag may follow other text right away.
    assert_eq!(sql("$a$ x$a$ :ds"), "$a$ x$a$ $1");
    assert_eq!(sql("$a$ $xa$ :ds $a$ :ds"), "$a$ $xa$ :ds $a$ $1");
    // `$` inside an identifier starts no quote.
    assert_eq!(sql("a$$ :ds"), "a$$ $1");
    assert_eq!(sql("a$b$ :ds"), "a$b$ $1");
    assert_eq!(sql("$ :ds"), "$ $1");
    assert_eq!(sql("$x :ds"), "$x $1");
}

#[test]
fn positional_parameters_are_an_error_in_code_only() {
    let e = err("SELECT $1");
    assert_eq!(e.offset, 7);
    assert_eq!(
        e.message,
        format!("use the named parameters {KNOWN} instead of `$1`")
    );
    assert_eq!(e.to_string(), e.message);
    let e = err(":ds + $12::int");
    assert_eq!(e.offset, 6);
    assert!(e.message.ends_with("instead of `$12`"), "{e}");
    assert_eq!(err("a[$1:2]").offset, 2);
    unchanged("'$1' \"$1\" -- $1\n/* $1 */ $$ $1 $$ E'\\'$1'");
    unchanged("a$1 + b$2");
}

#[test]
fn unknown_names_are_an_error_at_their_colon() {
    let e = err("SELECT * FROM t WHERE d = :dss");
    assert_eq!(
        e,
        ParamError {
            offset: 26,
            message: format!("unknown bind parameter `:dss`; use {KNOWN}"),
        }
    );
    assert_eq!(err(":ds = :DS").offset, 6);
    assert_eq!(err("'é' || :été").offset, 8);
    assert!(err("'é' || :été").message.contains("`:été`"));
    // The name runs on as SQLite's does.
    assert!(err(":dsé").message.contains("`:dsé`"));
    assert!(err(":ds$x").message.contains("`:ds$x`"));
    assert!(err(":ds_").message.contains("`:ds_`"));
    assert!(err(":ds1").message.contains("`:ds1`"));
}

#[test]
fn the_first_problem_is_reported() {
    assert_eq!(err(":nope $1").offset, 0);
    assert_eq!(err("$1 :nope").offset, 0);
}

#[test]
fn slices_are_not_parameters() {
    unchanged("a[1:2]");
    unchanged("a[lo:hi]");
    unchanged("a[:hi] || a[lo:] || a[:]");
    unchanged("a[1:2][3:n]");
    unchanged("(f(x))[lo:hi]");
    unchanged("'{}'::int[] || a[x[1]:y]");
    assert_eq!(sql("a[1:2] = :ds"), "a[1:2] = $1");
    assert_eq!(sql("a[f(:ds):2]"), "a[f($1):2]");
    assert_eq!(sql("a[1:2)] = :ds"), "a[1:2)] = $1");
}

#[test]
fn array_constructors_take_parameters() {
    assert_eq!(
        sql("d = ANY(ARRAY[:ds, :next_ds])"),
        "d = ANY(ARRAY[$1, $2])"
    );
    assert_eq!(sql("array [[:ds], [:next_ds]]"), "array [[$1], [$2]]");
    assert_eq!(sql("ARRAY[:ds, a[1:n]]"), "ARRAY[$1, a[1:n]]");
    assert_eq!(sql("ARRAY[:ds][1:n]"), "ARRAY[$1][1:n]");
    assert_eq!(sql("a[ARRAY[:ds]]"), "a[ARRAY[$1]]");
    unchanged("my_array[1:n]");
}

#[test]
fn non_ascii_text_is_kept_byte_for_byte() {
    assert_eq!(
        sql("SELECT 'é' AS été, \"ü:ds\" FROM 日本 WHERE d = :ds -- ☃ :ds\n/* ✓ */"),
        "SELECT 'é' AS été, \"ü:ds\" FROM 日本 WHERE d = $1 -- ☃ :ds\n/* ✓ */"
    );
    assert_eq!(sql("é:ds"), "é $1");
    assert_eq!(sql("(:ds)é"), "($1)é");
    assert_eq!(sql("$é$ :ds $é$:ds"), "$é$ :ds $é$ $1");
}

#[test]
fn unterminated_quotes_keep_their_tail() {
    unchanged("'abc :ds");
    unchanged("'abc'' :ds");
    unchanged(r"E'abc\' :ds");
    unchanged("E'\\");
    unchanged("\"abc :ds");
    unchanged("/* :ds");
    unchanged("/* /* :ds */ :ds");
    unchanged("$$ :ds");
    unchanged("$fn$ :ds $fn :ds $$");
    unchanged("-- :ds");
    assert_eq!(sql(":ds 'x :ds"), "$1 'x :ds");
    assert_eq!(sql(":ds $a$ é :ds"), "$1 $a$ é :ds");
}

#[test]
fn empty_and_trivial_inputs() {
    unchanged("");
    unchanged("SELECT 1");
    unchanged("'");
    unchanged("\"");
    unchanged("$");
    unchanged("/*");
    unchanged("/");
    unchanged("-");
    unchanged("E");
    unchanged("[");
    unchanged("]");
    unchanged(")");
}

/// A piece that uses no parameter in code.
fn text(s: String) -> (String, Vec<Param>) {
    (s, vec![])
}

/// One piece of a statement, and the parameters it uses in code.
fn piece() -> impl Strategy<Value = (String, Vec<Param>)> {
    let param = || proptest::sample::select(Param::ALL.to_vec());
    prop_oneof![
        param().prop_map(|p| (p.name().to_string(), vec![p])),
        param().prop_map(|p| (format!("{}::date", p.name()), vec![p])),
        (param(), param())
            .prop_map(|(a, b)| (format!("ARRAY[{}, ({})]", a.name(), b.name()), vec![a, b])),
        param().prop_map(|p| (format!("a[f({}):n]", p.name()), vec![p])),
        "[a-z_é][a-z0-9_é]{0,6}".prop_map(text),
        "[0-9]{1,4}".prop_map(text),
        proptest::sample::select(vec![
            "x::text",
            "'2026-01-01'::date",
            "a[1:2]",
            "a[lo:hi]",
            "f(a := 1)",
            "=",
            ",",
            "||",
            "$$ $$",
        ])
        .prop_map(|s| text(s.to_string())),
        "([a-z :é$\"*/-]|''){0,10}".prop_map(|s| text(format!("'{s}'"))),
        r"([a-z :é$]|\\'|\\\\|''){0,8}".prop_map(|s| text(format!("E'{s}'"))),
        "([a-z :é$'*/-]|\"\"){0,8}".prop_map(|s| text(format!("\"{s}\""))),
        "[a-z :é$'\"*/]{0,10}".prop_map(|s| text(format!("--{s}\n"))),
        ("[a-z :é$'\"-]{0,8}", "[a-z :é$'\"-]{0,8}")
            .prop_map(|(a, b)| text(format!("/*{a}/* {b} */{a}*/"))),
        ("(|fn|_é1)", "[a-z :é'\"*/-]{0,10}")
            .prop_map(|(tag, s)| text(format!("${tag}${s}${tag}$"))),
    ]
}

/// A statement of pieces separated by whitespace, and the distinct parameters it uses in
/// code, in order of first use.
fn statement() -> impl Strategy<Value = (String, Vec<Param>)> {
    proptest::collection::vec(
        (
            piece(),
            proptest::sample::select(vec![" ", "\n", "\t", "  "]),
        ),
        0..12,
    )
    .prop_map(|pieces| {
        let mut sql = String::new();
        let mut params = Vec::new();
        for ((text, used), sep) in pieces {
            sql.push_str(&text);
            sql.push_str(sep);
            for p in used {
                if !params.contains(&p) {
                    params.push(p);
                }
            }
        }
        (sql, params)
    })
}

/// What holds for every input: an error points at a `:` or `$` of the input, and a
/// rewrite maps back to its input.
fn check_any(input: &str, first: usize) -> Result<(), TestCaseError> {
    match positional_from(input, first) {
        Err(e) => {
            prop_assert!(input.is_char_boundary(e.offset));
            prop_assert!(matches!(input.as_bytes()[e.offset], b':' | b'$'), "{e:?}");
        }
        Ok(p) => {
            for (i, a) in p.params.iter().enumerate() {
                prop_assert!(!p.params[..i].contains(a));
            }
            if !has_positional(input) {
                // A space may go in front of a parameter right after a word.
                let loose = |s: &str| s.replace(" :", ":");
                prop_assert_eq!(loose(&named(&p, first)), loose(input));
            }
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn never_panics_on_any_string(input in any::<String>(), first in 1_usize..1000) {
        check_any(&input, first)?;
    }

    #[test]
    fn never_panics_on_sql_like_noise(
        input in "([:$'\"eE\\\\/*\\[\\](),a-z0-9_ é\n-]|:ds|:next_ds|\\$\\$|/\\*|\\*/|--){0,40}",
        first in 1_usize..4,
    ) {
        check_any(&input, first)?;
    }

    #[test]
    fn never_panics_near_usize_max(input in "[:a-z_ $1]{0,30}", back in 0_usize..6) {
        let _ = positional_from(&input, usize::MAX - back);
    }

    #[test]
    fn statements_map_back_to_their_input(
        (input, expected) in statement(),
        first in 1_usize..100,
    ) {
        let got = positional_from(&input, first)
            .map_err(|e| TestCaseError::fail(format!("{input:?}: {e:?}")))?;
        prop_assert_eq!(&got.params, &expected, "{:?} -> {:?}", input, got.sql);
        let want: std::collections::BTreeSet<_> = (first..first + expected.len()).collect();
        prop_assert_eq!(numbers(&got.sql), want, "{:?}", got.sql);
        prop_assert_eq!(named(&got, first), input.clone());
        prop_assert_eq!(positional(&input).map(|p| p.params), Ok(expected));
    }
}
