//! The table of error codes and the docs agree: `docs/api.md`'s "Error codes" table has exactly
//! the rows of [`ErrorCode`], `docs/openapi.yaml`'s `Error.code` enum exactly its strings, and
//! every code the docs name with a status (`` `404 topic_not_found` ``, or a row of a table
//! with a `` `code` `` column) is a live code answered with that status. A code added without
//! documentation, or documentation of a code that does not exist, fails here.

use std::collections::BTreeSet;

use narad_wire::ErrorCode;

fn doc(name: &str) -> String {
    let path = format!("{}/../docs/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The cells of a Markdown table row (`None` for other lines).
fn cells(line: &str) -> Option<Vec<&str>> {
    let l = line.trim();
    let inner = l.strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// The backtick spans of `text` (spans may cross a line break).
fn spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn is_code_like(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// `(status, code)` for each span of the form `NNN code`.
fn status_code_spans(text: &str) -> Vec<(u16, String)> {
    spans(text)
        .iter()
        .filter_map(|s| {
            let (status, code) = s.split_once(' ')?;
            let status: u16 = status.parse().ok().filter(|_| status.len() == 3)?;
            is_code_like(code).then(|| (status, code.to_owned()))
        })
        .collect()
}

/// Fails with every mismatch at once.
fn check_named(place: &str, named: &[(u16, String)], problems: &mut Vec<String>) {
    for (status, code) in named {
        match ErrorCode::from_code(code) {
            None => problems.push(format!("{place}: `{status} {code}` names no error code")),
            Some(c) if c.http_status() != *status => problems.push(format!(
                "{place}: `{status} {code}` but the table answers {code} with {}",
                c.http_status()
            )),
            Some(_) => {}
        }
    }
}

fn report(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn api_md_has_the_table_of_error_codes() {
    let md = doc("api.md");
    let start = md
        .find("\n## Error codes\n")
        .expect("docs/api.md has a section `## Error codes`");
    let rows: Vec<(u16, String, u16)> = md[start..]
        .lines()
        .skip(2)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(cells)
        .filter_map(|c| {
            let number = c.first()?.parse().ok()?;
            let code = c.get(1)?.trim_matches('`').to_owned();
            let status = c.get(2)?.parse().ok()?;
            Some((number, code, status))
        })
        .collect();
    let table: Vec<(u16, String, u16)> = ErrorCode::ALL
        .iter()
        .map(|c| (c.number(), c.as_str().to_owned(), c.http_status()))
        .collect();
    let mut problems = Vec::new();
    for row in &rows {
        if !table.contains(row) {
            problems.push(format!(
                "docs/api.md row {row:?} (number, code, status) is not in ErrorCode"
            ));
        }
    }
    for row in &table {
        if !rows.contains(row) {
            problems.push(format!(
                "ErrorCode {row:?} (number, code, status) is missing from docs/api.md's table"
            ));
        }
    }
    if problems.is_empty() {
        assert_eq!(rows, table, "docs/api.md lists the codes in number order");
    }
    report(problems);
}

#[test]
fn every_code_docs_md_name_with_a_status_is_live_with_that_status() {
    let dir = format!("{}/../docs", env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        files += 1;
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        check_named(&name, &status_code_spans(&text), &mut problems);
        // rows of tables whose second column is `code`: | 404 | `topic_not_found`, ... | ... |
        let mut code_table = false;
        let mut in_table = false;
        for line in text.lines() {
            let Some(c) = cells(line) else {
                in_table = false;
                continue;
            };
            if !in_table {
                in_table = true;
                code_table = c.get(1) == Some(&"`code`");
                continue;
            }
            let (Some(status), Some(codes)) = (c.first(), c.get(1)) else {
                continue;
            };
            let Ok(status) = status.parse::<u16>() else {
                continue;
            };
            if code_table && status >= 400 {
                let named: Vec<_> = spans(codes)
                    .into_iter()
                    .map(|code| (status, code))
                    .collect();
                check_named(&format!("{name} `{line}`"), &named, &mut problems);
            }
        }
    }
    assert!(files >= 5, "docs/*.md found");
    report(problems);
}

#[test]
fn openapi_error_enum_is_the_table() {
    let yaml = doc("openapi.yaml");
    // components.schemas.Error.properties.code.enum: the `- item` lines after `enum:`
    let error = yaml
        .find("\n    Error:\n")
        .expect("openapi.yaml has the Error schema");
    let after = &yaml[error..];
    let code = after.find("\n        code:\n").expect("Error has code");
    let enum_at = after[code..].find("enum:").expect("Error.code has an enum") + code;
    let listed: Vec<&str> = after[enum_at..]
        .lines()
        .skip(1)
        .map_while(|l| l.trim().strip_prefix("- "))
        .collect();
    let listed_set: BTreeSet<&str> = listed.iter().copied().collect();
    let table: BTreeSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(listed.len(), listed_set.len(), "a code is listed twice");
    let missing: Vec<_> = table.difference(&listed_set).collect();
    let unknown: Vec<_> = listed_set.difference(&table).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/openapi.yaml Error.code enum: missing {missing:?}, not in ErrorCode {unknown:?}"
    );
}

#[test]
fn openapi_names_codes_with_their_status() {
    let yaml = doc("openapi.yaml");
    let mut problems = Vec::new();
    check_named("openapi.yaml", &status_code_spans(&yaml), &mut problems);
    // under a response key `"404":`, a live code named in its description is a 404 code
    let mut status: Option<u16> = None;
    for line in yaml.lines() {
        let t = line.trim();
        if let Some(s) = t
            .strip_suffix("\":")
            .and_then(|s| s.strip_prefix('"'))
            .and_then(|s| s.parse::<u16>().ok())
        {
            status = Some(s);
            continue;
        }
        if let (Some(s), Some(d)) = (status, t.strip_prefix("description:")) {
            if s >= 400 {
                let named: Vec<_> = spans(d)
                    .into_iter()
                    .filter(|c| ErrorCode::from_code(c).is_some())
                    .map(|c| (s, c))
                    .collect();
                check_named(&format!("openapi.yaml \"{s}\""), &named, &mut problems);
            }
            status = None;
        }
    }
    report(problems);
}

#[test]
fn the_checks_catch_a_wrong_status_and_an_unknown_code() {
    let mut problems = Vec::new();
    check_named(
        "sample",
        &status_code_spans("`404 topic_not_found` and `409\ntopic_not_found` and `400 no_such`"),
        &mut problems,
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
}
