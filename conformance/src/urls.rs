//! Database URLs for the harnesses: the servers the environment names, the database a URL
//! names, the same URL on another database or with another search path, parameters added to
//! its query. Text only: no driver parses them.

/// The environment variable that names the PostgreSQL server of the suites.
pub const PG_URL_VAR: &str = "RUSTSTREAM_PG_URL";

/// The PostgreSQL server when [`PG_URL_VAR`] is not set.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The environment variable that names the MariaDB (or MySQL) server of the suites.
pub const MYSQL_URL_VAR: &str = "RUSTSTREAM_MYSQL_URL";

/// The MariaDB server when [`MYSQL_URL_VAR`] is not set.
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// The PostgreSQL server's URL: [`PG_URL_VAR`], or [`DEFAULT_PG_URL`].
pub fn postgres() -> String {
    std::env::var(PG_URL_VAR).unwrap_or_else(|_| DEFAULT_PG_URL.to_owned())
}

/// The MariaDB server's URL: [`MYSQL_URL_VAR`], or [`DEFAULT_MYSQL_URL`].
pub fn mysql() -> String {
    std::env::var(MYSQL_URL_VAR).unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_owned())
}

/// `url` with these parameters (`a=1&b=2`) added to its query.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A PostgreSQL `url` whose sessions work in `schema`: the schema is the search path of every
/// session the URL opens (`options=-c search_path=<schema>`, which libpq, tokio-postgres and
/// sqlx read alike) and its application name, so the suite's unqualified table names land
/// there.
pub fn with_search_path(url: &str, schema: &str) -> String {
    with_params(
        url,
        &format!("application_name={schema}&options=-c%20search_path%3D{schema}"),
    )
}

/// The schema a URL of [`with_search_path`] works in.
pub fn search_path_of(url: &str) -> Option<&str> {
    url.split("search_path%3D")
        .nth(1)
        .map(|rest| rest.split('&').next().unwrap_or(rest))
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
pub fn database_of(url: &str) -> Option<&str> {
    let (start, end) = path_span(url);
    Some(&url[start..end]).filter(|db| !db.is_empty())
}

/// `url` on the database `db`, its query kept.
pub fn with_database(url: &str, db: &str) -> String {
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

    #[test]
    fn search_paths() {
        let url = with_search_path("postgres://h/test", "cf_t_x1");
        assert_eq!(
            url,
            "postgres://h/test?application_name=cf_t_x1&options=-c%20search_path%3Dcf_t_x1"
        );
        assert_eq!(search_path_of(&url), Some("cf_t_x1"));
        let url = with_search_path("postgres://h/test?sslmode=disable", "s");
        assert_eq!(search_path_of(&url), Some("s"));
        assert_eq!(database_of(&url), Some("test"));
        assert_eq!(search_path_of("postgres://h/test"), None);
    }
}
