//! Database URLs: the database a URL names, the same URL on another database, parameters added
//! to its query.

/// `url` with these parameters (`a=1&b=2`) added to its query.
#[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
pub(crate) fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Where the path of `url` starts and ends (the path without its `/`; empty when there is
/// none).
fn path_span(url: &str) -> (usize, usize) {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    if !url[authority_end..].starts_with('/') {
        return (authority_end, authority_end);
    }
    let start = authority_end + 1;
    let end = url[start..]
        .find(['?', '#'])
        .map_or(url.len(), |i| start + i);
    (start, end)
}

/// The database `url` names (its path), if it names one.
pub(crate) fn database_of(url: &str) -> Option<&str> {
    let (start, end) = path_span(url);
    Some(&url[start..end]).filter(|db| !db.is_empty())
}

/// `url` on the database `db`, its query kept.
pub(crate) fn with_database(url: &str, db: &str) -> String {
    let (start, end) = path_span(url);
    if start == end && !url[..start].ends_with('/') {
        return format!("{}/{db}{}", &url[..start], &url[start..]);
    }
    format!("{}{db}{}", &url[..start], &url[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn databases() {
        let url = "mysql://root@127.0.0.1:3306/test";
        assert_eq!(database_of(url), Some("test"));
        assert_eq!(
            with_database(url, "cf_x_q1"),
            "mysql://root@127.0.0.1:3306/cf_x_q1"
        );
        let url = "postgres://u:p@h/test?sslmode=disable";
        assert_eq!(database_of(url), Some("test"));
        assert_eq!(
            with_database(url, "other"),
            "postgres://u:p@h/other?sslmode=disable"
        );
        assert_eq!(database_of("mysql://h:1"), None);
        assert_eq!(with_database("mysql://h:1", "d"), "mysql://h:1/d");
        assert_eq!(with_database("mysql://h:1?a=b", "d"), "mysql://h:1/d?a=b");
        assert_eq!(with_database("mysql://h:1/", "d"), "mysql://h:1/d");
        assert_eq!(with_params("p://h/d", "a=1"), "p://h/d?a=1");
        assert_eq!(with_params("p://h/d?x=2", "a=1"), "p://h/d?x=2&a=1");
    }
}
