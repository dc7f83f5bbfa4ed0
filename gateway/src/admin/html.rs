//! HTML building blocks for the server-rendered pages: escaping, query strings and the
//! page frame (header, navigation, log-out form).
//!
//! Invariant: every value that reaches a page from a record, a request, the config or a
//! rule file goes through [`esc`] (text and double-quoted attribute values alike) or
//! [`query`] (URLs). Only `&'static str` markup written in this module's callers is
//! emitted raw. The pages carry no inline script or style: the Content-Security-Policy set
//! in [`super::security_headers`] would refuse them anyway.

use std::fmt::Write as _;

/// `s` with the five HTML-significant characters replaced by entities; safe in text and
/// in double- or single-quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `k=v&k=v` with every byte outside the URL-unreserved set percent-encoded; pairs with
/// an empty value are left out. The result still needs [`esc`] inside an attribute (`&`).
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (key, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        if !out.is_empty() {
            out.push('&');
        }
        percent_encode(&mut out, key);
        out.push('=');
        percent_encode(&mut out, value);
    }
    out
}

/// Percent-encodes one path segment or query component.
pub fn percent_encode(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// `s` as one percent-encoded path segment.
pub fn segment(s: &str) -> String {
    let mut out = String::new();
    percent_encode(&mut out, s);
    out
}

/// The dashboard's sections, for the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Blocked,
    Tenants,
    Rules,
    Health,
}

const SECTIONS: [(Section, &str, &str); 4] = [
    (Section::Blocked, "/admin", "Blocked"),
    (Section::Tenants, "/admin/tenants", "Tenants"),
    (Section::Rules, "/admin/rules", "Rules"),
    (Section::Health, "/admin/health", "Health"),
];

/// A whole page: `body` (already escaped markup) inside the frame. `csrf` feeds the
/// log-out form; `None` for the login page, which has no navigation.
pub fn frame(title: &str, active: Option<Section>, csrf: Option<&str>, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · crossguard admin</title>\
         <link rel=\"stylesheet\" href=\"/admin/assets/admin.css\">\
         <script src=\"/admin/assets/admin.js\" defer></script></head><body>\
         <header class=\"top\"><a class=\"brand\" href=\"/admin\">crossguard<span>admin</span></a>",
        esc(title)
    );
    if let Some(csrf) = csrf {
        out.push_str("<nav>");
        for (section, href, label) in SECTIONS {
            let current = if Some(section) == active { " aria-current=\"page\"" } else { "" };
            let _ = write!(out, "<a href=\"{href}\"{current}>{label}</a>");
        }
        let _ = write!(
            out,
            "</nav><form method=\"post\" action=\"/admin/logout\" class=\"logout\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\">Log out</button></form>",
            esc(csrf)
        );
    }
    let _ = write!(out, "</header><main><h1>{}</h1>{body}</main></body></html>", esc(title));
    out
}

/// A small `<dl>` of label/value pairs; values are escaped here.
pub fn facts(pairs: &[(&str, String)]) -> String {
    let mut out = String::from("<dl class=\"facts\">");
    for (label, value) in pairs {
        let _ = write!(out, "<div><dt>{}</dt><dd>{}</dd></div>", esc(label), esc(value));
    }
    out.push_str("</dl>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(esc("<img src=x onerror='a()'>&\""), "&lt;img src=x onerror=&#39;a()&#39;&gt;&amp;&quot;");
        assert_eq!(esc("plain text"), "plain text");
    }

    #[test]
    fn query_strings_encode_everything_but_unreserved() {
        assert_eq!(query(&[("tenant", "a b&c=<d>"), ("rule", ""), ("x", "é")]), "tenant=a%20b%26c%3D%3Cd%3E&x=%C3%A9");
        assert_eq!(segment("../x y"), "..%2Fx%20y");
    }

    #[test]
    fn the_frame_escapes_the_title_and_marks_the_current_section() {
        let page = frame("<b>", Some(Section::Rules), Some("tok\"en"), "<p>body</p>");
        assert!(page.contains("<h1>&lt;b&gt;</h1>") && !page.contains("<b>"));
        assert!(page.contains("<a href=\"/admin/rules\" aria-current=\"page\">Rules</a>"));
        assert!(page.contains("value=\"tok&quot;en\""));
        assert!(!frame("Log in", None, None, "").contains("logout"));
    }
}
