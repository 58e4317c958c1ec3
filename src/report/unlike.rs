//! Partitions recorded as published that their target no longer holds (see
//! [`crate::reads::unlike_published`]), in words.

/// What [`crate::reads::unlike_published`] found, as a warning: each partition (five at most),
/// that `skipper` (the reprocess behaviours that do) skips them, and the command that computes
/// them again. `None` when nothing was found.
pub(crate) fn words(
    dag: &crate::project::Dag,
    unlike: &[crate::reads::Unlike],
    skipper: &str,
) -> Option<String> {
    const SHOWN: usize = 5;
    let starts = unlike.iter().map(|u| u.interval.start);
    let (first, last) = (starts.clone().min()?, starts.max()?);
    let label = super::Labeler::new(dag);
    let tasks: std::collections::HashSet<&str> =
        unlike.iter().map(|u| u.task_id.as_str()).collect();
    let mut each: Vec<String> = unlike
        .iter()
        .take(SHOWN)
        .map(|u| {
            let task = if tasks.len() > 1 {
                format!("task `{}` ", u.task_id)
            } else {
                String::new()
            };
            format!(
                "{task}{} ({} published, {} now)",
                label.label(u.interval.start),
                super::out::plural(u.published, "row", "rows"),
                u.now
            )
        })
        .collect();
    if unlike.len() > SHOWN {
        each.push(format!("and {} more", unlike.len() - SHOWN));
    }
    // Dates name a daily DAG's intervals exactly, instants any other's (an interval starting
    // then); `--from` and `--to` as typed would move with a relative one.
    let (from, to) = if dag.schedule.at_most_daily() {
        (label.label(first), label.label(last))
    } else {
        let instant =
            |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        (instant(first), instant(last))
    };
    let one = unlike.len() == 1;
    Some(format!(
        "{} of DAG {} recorded as published no longer {} the rows that were published: {}; {skipper} skips {} as already existing, and `{}` computes {} again",
        super::out::plural(
            i64::try_from(unlike.len()).unwrap_or(i64::MAX),
            "partition",
            "partitions"
        ),
        dag.id,
        if one { "holds" } else { "hold" },
        each.join(", "),
        if one { "it" } else { "them" },
        super::out::hint(&format!(
            "create --dag {} --from {from} --to {to} --reprocess-behavior completed",
            dag.id
        )),
        if one { "it" } else { "them" },
    ))
}
