"""The generated site in a real browser: loads clean, the slider, the cards, the index, links, keyboard."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlparse

import pytest

from .conftest import ARTIFACTS, NASTY, ROOT

pytestmark = pytest.mark.browser



def _search(page: Any, query: str) -> None:
    """Type a query and wait for its results: the search is debounced, its entries load on first use."""
    page.fill("#search", query)
    page.wait_for_function("q => document.getElementById('results').dataset.query === q", arg=query.strip().lower())

def _pages(site: Path) -> list[Path]:
    return sorted(site.glob("*.html"))


def _open(page: Any, path: Path) -> None:
    page.goto(path.as_uri())
    page.wait_for_load_state("load")


class Walk(NamedTuple):
    """What one visit of every page of both sites saw: titles, console errors and outside requests,
    what sticks out sideways at 390 px, and each page's ids and links."""
    seen: list[str]
    errors: list[str]
    requests: list[str]
    wide: list[tuple[str, list[str]]]
    ids: dict[tuple[str, str], set[str]]  # (site tag, page) -> its element ids
    links: dict[tuple[str, str], list[str]]  # (site tag, page) -> its href and src attributes
    phone: list[tuple[str, dict[str, list[str]]]]  # pages with text, code or tap targets too small at 390 px, or no scroll cue
    broken_words: list[str]  # words of status.html broken across two lines at 390 px
    contrast: list[tuple[str, str, dict[str, Any]]]  # (page, scheme, what it measured) for text under WCAG AA
    schemes: dict[str, set[str]]  # page -> the colour schemes its contrast was measured in


# Full-page screenshots of a representative set (the site's own pages and one family of each kind: dense,
# mixture, hybrid, image-text); the other pages are visited and checked at both widths, not shot. Full-page shots
# of every page (a long page is ~30,000 px tall at 390 px) were most of the browser suite's time.
FULL_PAGE = {"index", "matrix", "status", "cookbook", "api", "spec", "llama", "mixtral", "jamba", "qwen3_5_text",
             "hybrid_test", "guide-caching"}

_WIDE = """() => { const w = document.documentElement.clientWidth;
    const out = [];
    if (document.documentElement.scrollWidth > w) {
      for (const e of document.querySelectorAll('body *')) {
        if (e.closest('.scroll, pre, .code-wrap')) continue;
        const r = e.getBoundingClientRect();
        if (r.right > w + 1 && r.width > 0) out.push(e.tagName + '.' + e.className + ' ' + Math.round(r.right));
      }
      out.unshift('scrollWidth ' + document.documentElement.scrollWidth);
    }
    return out.slice(0, 6); }"""

# At 390 px: text at least 14 px, code (and monospace names) at least 12 px, what one taps at least 24 x 24 px,
# and every area that scrolls sideways has its cue (a shadowed edge and a "scroll →" hint before it)
_PHONE = """() => {
  const small = [], code = [], taps = [], cues = [];
  const vis = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== 'hidden'; };
  for (const e of document.querySelectorAll('body *')) {
    if (!vis(e) || !Array.from(e.childNodes).some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const px = parseFloat(getComputedStyle(e).fontSize);
    const inCode = e.closest('code, pre, kbd, samp') || getComputedStyle(e).fontFamily.includes('monospace');
    if (px < (inCode ? 12 : 14)) (inCode ? code : small).push(e.tagName + '.' + e.className + ' ' + px);
  }
  for (const e of document.querySelectorAll('button, select, input, summary, .tick, nav a, .crumbs a, .hub-links a, a.permalink, .legend a')) {
    if (!vis(e)) continue;
    const r = e.getBoundingClientRect();
    if (r.width < 24 || r.height < 24) taps.push(e.tagName + '.' + e.className + ' ' + Math.round(r.width) + 'x' + Math.round(r.height));
  }
  for (const e of document.querySelectorAll('.scroll')) {
    if (!vis(e) || e.scrollWidth <= e.clientWidth + 1) continue;
    const hint = e.previousElementSibling;
    if (!e.classList.contains('scrollable') || !hint || !hint.classList.contains('scroll-hint') || !vis(hint)) cues.push(e.className);
  }
  const out = {};
  for (const [k, v] of [['text', small], ['code', code], ['taps', taps], ['cues', cues]]) { if (v.length) out[k] = v.slice(0, 4); }
  return out; }"""

# a word split over two lines has two client rects (a break after a hyphen or a slash is a break between words)
_BROKEN_WORDS = """() => {
  const out = [], range = document.createRange();
  const walker = document.createTreeWalker(document.querySelector('main') || document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const re = /[^\\s\\-\\/]{2,}/g;
    for (let m = re.exec(n.textContent); m; m = re.exec(n.textContent)) {
      range.setStart(n, m.index); range.setEnd(n, m.index + m[0].length);
      const rects = Array.from(range.getClientRects()).filter(r => r.width > 0);
      if (rects.length > 1 && rects[1].top > rects[0].top + 2) out.push(m[0]);
    }
  }
  return out.slice(0, 8); }"""


# WCAG contrast of every kind of visible text on the page (one element per tag, classes and inline style up to
# the body) against what is painted behind it: the text colour over its ancestors' backgrounds over the canvas,
# opacity included; AA is 4.5:1, 3:1 for large text. ``body``: the least ratio of the body text (the CSS keeps
# it at 7:1 in dark mode).
_CONTRAST = """() => {
  // WCAG contrast of each visible text run against what is painted behind it: the text colour over its
  // ancestors' backgrounds, over the canvas, opacity included (4.5:1; 3:1 for large text)
  const rgba = c => { const m = c.match(/[\\d.]+/g) || [0, 0, 0, 0]; return [+m[0], +m[1], +m[2], m.length > 3 ? +m[3] : 1]; };
  const over = (top, under) => [0, 1, 2].map(k => top[k] * top[3] + under[k] * (1 - top[3])).concat([1]);
  const lum = c => { const v = c.slice(0, 3).map(x => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; });
                     return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const style = new Map(), sty = e => { let s = style.get(e); if (!s) { s = getComputedStyle(e); style.set(e, s); } return s; };
  const page = rgba(sty(document.documentElement).backgroundColor), body = rgba(sty(document.body).backgroundColor);
  const canvas = page[3] > 0 ? page : body[3] > 0 ? body : [255, 255, 255, 1];
  const paint = new Map();  // element -> [background behind its content, opacity product]
  const at = e => {
    if (!e || e === document.documentElement) return [over(canvas, [255, 255, 255, 1]), 1];
    let p = paint.get(e);
    if (p) return p;
    const s = sty(e), up = at(e.parentElement), c = rgba(s.backgroundColor);
    p = [c[3] > 0 ? over(c, up[0]) : up[0], up[1] * +s.opacity];
    paint.set(e, p);
    return p;
  };
  const owners = new Set(), walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) if (n.textContent.trim()) owners.add(n.parentElement);
  // one element of each kind: the same tag, classes and inline styles up to the body paint the same
  const sig = new Map(), key = e => { if (!e || e === document.body) return ''; let k = sig.get(e);
    if (k === undefined) { k = key(e.parentElement) + '>' + e.tagName + '.' + (e.getAttribute('class') || '') + (e.getAttribute('style') || '') +
                                (e.matches(':hover, :focus, [aria-pressed=true], .current') ? '!' : ''); sig.set(e, k); } return k; };
  const seen = new Set(), bad = [];
  let checked = 0, least = 99;
  for (const e of owners) {
    const k = key(e);
    if (seen.has(k)) continue;
    const s = sty(e);
    if (s.visibility === 'hidden' || !e.getClientRects().length) continue;
    seen.add(k);
    const [b, op] = at(e), fg = rgba(s.color);
    const la = lum(over([fg[0], fg[1], fg[2], fg[3] * op], b)), lb = lum(b);
    const ratio = (Math.max(la, lb) + 0.05) / (Math.min(la, lb) + 0.05), px = parseFloat(s.fontSize);
    checked++;
    if (e.matches('main p, main td, main li, main h2')) least = Math.min(least, ratio);
    if (ratio < (px >= 24 || (px >= 18.66 && +s.fontWeight >= 700) ? 3 : 4.5))
      bad.push(e.tagName.toLowerCase() + '.' + String(e.className.baseVal ?? e.className).trim() + ' ' + ratio.toFixed(2));
  }
  return {checked, body: least, dark: lum(canvas) < 0.05, bad: Array.from(new Set(bad)).slice(0, 6)};
}"""


@pytest.fixture(scope="module")
def walk(browser: Any, real_site: Path, test_site: Path) -> Walk:
    """One browser page visits every page of both sites once (the widths are a resize of the same page):
    full-page screenshots of FULL_PAGE at 1400 and 390 px land in artifacts/screenshots; the tests below read
    what it saw."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.jpg"):  # this walk's own output from an earlier run
        old.unlink()
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    out = Walk([], [], [], [], {}, {}, [], [], [], {})
    page.on("console", lambda m: out.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: out.errors.append(str(e)))
    page.on("requestfailed", lambda r: out.errors.append(f"failed {r.url}"))
    page.on("request", lambda r: out.requests.append(r.url) if not r.url.startswith(("file:", "data:", "blob:")) else None)
    scheme = ""

    def colours(want: str) -> None:  # prefers-color-scheme, switched only when it changes (a restyle of the page)
        nonlocal scheme
        if want != scheme:
            page.emulate_media(color_scheme=want)  # type: ignore[arg-type]
            scheme = want

    def contrast(name: str) -> None:
        seen = page.evaluate(_CONTRAST)
        out.schemes.setdefault(name, set()).add(scheme)
        if seen["bad"] or seen["dark"] != (scheme == "dark") or seen["checked"] < 3 \
                or seen["body"] < (7 if scheme == "dark" else 4.5):
            out.contrast.append((name, scheme, seen))

    try:
        for site, tag in ((real_site, "site"), (test_site, "test")):
            for path in _pages(site):
                full = path.stem in FULL_PAGE if tag == "site" else path.stem == "hybrid_test"  # the test site: its own family
                # a page shot loads light (the screenshots are light), every other one dark: its contrast is
                # measured in the scheme it loaded in, with no restyle
                colours("light" if full else "dark")
                page.set_viewport_size({"width": 1400, "height": 900})
                _open(page, path)
                assert page.title(), path
                out.ids[(tag, path.name)] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
                out.links[(tag, path.name)] = page.eval_on_selector_all(
                    "a[href], link[href], script[src]", "els => els.map(e => e.getAttribute('href') || e.getAttribute('src'))")
                for width in (1400, 390):
                    page.set_viewport_size({"width": width, "height": 900})
                    if full:
                        if width == 1400 and page.query_selector("button.part.role-mixer"):
                            page.hover("button.part.role-mixer")
                        else:
                            page.mouse.move(0, 0)
                        page.screenshot(path=str(ARTIFACTS / f"{tag}-{path.stem}-{width}.jpg"), full_page=True,
                                        type="jpeg", quality=60)
                    if width == 390:
                        # two frames: the page's resize handlers (the scroll cues) run before it is measured
                        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                        over = page.evaluate(_WIDE)
                        if over:
                            out.wide.append((path.name, over))
                        small = page.evaluate(_PHONE)
                        if small:
                            out.phone.append((path.name, small))
                        if (tag, path.name) == ("site", "status.html"):
                            out.broken_words.extend(page.evaluate(_BROKEN_WORDS))
                name = f"{tag}/{path.name}"
                if full:  # shot in light: measured there, then in dark
                    contrast(name)
                    colours("dark")
                contrast(name)
                out.seen.append(path.name)
    finally:
        ctx.close()
    return out


def test_every_page_loads_clean_and_is_screenshotted_at_1400_and_390(walk: Walk) -> None:
    assert walk.errors == []
    assert {"index.html", "llama.html", "gpt2.html", "gemma2.html", "qwen3_5_text.html", "hybrid_test.html",
            "cookbook.html", "spec.html", "matrix.html", "guide-nasty-guide.html"} <= set(walk.seen)
    guides = {f"guide-{p.stem}.html" for p in (ROOT / "docs").glob("*.md") if p.stem not in ("spec", "cookbook")}
    assert len(guides) >= 9 and guides <= set(walk.seen)  # every page of the manual, at 1400 and 390 px
    assert walk.requests == []
    for name in ("site-index", "site-llama", "test-hybrid_test"):
        assert all((ARTIFACTS / f"{name}-{width}.jpg").stat().st_size > 1000 for width in (1400, 390)), name


def test_every_page_keeps_its_text_legible_in_dark_mode(walk: Walk) -> None:
    """Issue 30, dark mode (prefers-color-scheme): every page of both sites, measured in the walk at 390 px,
    has a dark background, body text at 7:1 and every other visible text at WCAG AA (4.5:1, large text 3:1)
    on what is painted behind it; the pages shot in light are measured in light too (AA throughout). (A heading's permalink
    "#" at opacity 0.35 was 2.1:1 on every page.)"""
    assert walk.contrast == []
    assert set(walk.schemes) == {f"{tag}/{name}" for tag in ("site", "test") for name in
                                 {n for (t, n) in walk.ids if t == tag}}
    assert all("dark" in s for s in walk.schemes.values())
    assert {n for n, s in walk.schemes.items() if "light" in s} == {f"site/{n}.html" for n in FULL_PAGE - {"hybrid_test"}} | \
        {"test/hybrid_test.html"}


def test_no_page_scrolls_sideways_on_a_phone(walk: Walk) -> None:
    """At 390 px the document is no wider than the screen: what is wider scrolls inside its own area
    (.scroll around tables, pre)."""
    assert walk.wide == []


def test_on_a_phone_text_code_and_tap_targets_are_big_enough_and_wide_tables_say_they_scroll(walk: Walk) -> None:
    """Issue 30, at 390 px on every page: text >= 14 px, code >= 12 px, buttons, nav links and slider ticks
    >= 24 x 24 px (deepseek_v3's 61 ticks were 5 px wide), a scroll cue on each area wider than the screen;
    the status page breaks no word in the middle."""
    assert walk.phone == []
    assert "status.html" in walk.seen and walk.broken_words == []


# the only outside addresses a page may name: a checkpoint's hub page and its paper (links, never loaded)
OUTSIDE = re.compile(r"https://huggingface\.co/[\w.-]+(?:/[\w.-]+)?|https://arxiv\.org/abs/\d{4}\.\d{4,5}")


def test_no_internal_link_is_broken(walk: Walk, real_site: Path, test_site: Path) -> None:
    checked = 0
    for (tag, name), hrefs in walk.links.items():
        site = real_site if tag == "site" else test_site
        for href in hrefs:
            url = urlparse(href)
            if url.scheme:
                assert OUTSIDE.fullmatch(href), f"{name}: external reference {href}"
                continue
            assert not url.netloc, f"{name}: external reference {href}"
            target = url.path or name
            assert (site / unquote(target)).is_file(), f"{name}: broken link {href}"
            if url.fragment and target.endswith(".html"):
                assert unquote(url.fragment) in walk.ids[(tag, target)], f"{name}: no #{url.fragment} in {target}"
            checked += 1
    assert checked > 50


def test_the_slider_redraws_the_block_kind_on_a_hybrid_family(page: Any, test_site: Path) -> None:
    _open(page, test_site / "hybrid_test.html")
    section = page.locator("section#block")
    slider = section.locator("input.slider")
    visible = section.locator(".kind:not([hidden])")
    assert visible.count() == 1
    assert section.locator(".kind").count() == 2
    first = visible.get_attribute("data-label")
    assert "linear_attn" in first and visible.locator("button.part", has_text="linear_attn").count() == 1
    slider.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    assert section.locator(".pick-i").inner_text() == "i = 3"
    visible = section.locator(".kind:not([hidden])")
    assert visible.count() == 1
    label = visible.get_attribute("data-label")
    assert label != first and "self_attn" in label and "linear_attn" not in label
    assert visible.locator("button.part", has_text="self_attn").count() == 1
    assert section.locator(".kind-name").inner_text() == label
    slider.fill("4")  # back to a linear block
    assert "linear_attn" in section.locator(".kind:not([hidden])").get_attribute("data-label")
    assert page.errors == []


def test_hover_and_focus_show_the_card_with_the_standard_name_and_click_pins(page: Any, real_site: Path) -> None:
    _open(page, real_site / "llama.html")
    part = page.locator("section#block .kind:not([hidden]) button.part.role-mixer")
    card = page.locator("#" + part.get_attribute("data-card"))
    assert card.is_hidden()
    part.hover()
    assert card.is_visible()
    assert card.locator(".card-std").inner_text() == "attention_output"
    assert "What the attention adds to the residual stream" in card.inner_text()
    assert "Residual [batch seq hidden_size]" in card.inner_text()
    page.mouse.move(0, 0)
    assert card.is_hidden()
    mlp = page.locator("section#block .kind:not([hidden]) button.part.role-mlp")
    mlp.focus()
    mcard = page.locator("#" + mlp.get_attribute("data-card"))
    assert mcard.is_visible() and mcard.locator(".card-std").inner_text() == "mlp_output"
    # click pins: the card stays when the pointer leaves, and another part's hover does not replace it
    part.click()
    page.mouse.move(0, 0)
    assert card.is_visible() and part.get_attribute("aria-pressed") == "true"
    norm = page.locator("section#block .chain button.part.role-norm")
    norm.hover()
    assert card.is_visible()
    part.click()
    assert part.get_attribute("aria-pressed") == "false"
    assert page.errors == []


def test_search_and_trait_filter_narrow_the_index(page: Any, test_site: Path, real_site: Path) -> None:
    _open(page, real_site / "index.html")
    families = page.locator("li.family:not([hidden])")
    total = families.count()
    assert total >= 2
    index: list[dict[str, str]] = []

    def hit(term: str) -> list[str]:  # the families whose index entries name the term, in page order
        named = {e["family"] for e in index if term.lower() in e.get("text", e["name"]).lower()}
        return [f for f in page.eval_on_selector_all("li.family", "els => els.map(e => e.dataset.family)") if f in named]

    def shown() -> list[str]:
        return [families.nth(i).get_attribute("data-family") for i in range(families.count())]

    _search(page, "LlamaAttention")
    # the entries atlas.js unpacked from search.js (loaded by the first search) are the ones the compiler packed
    from nnatlas.compiler.emit import search_index

    index.extend(page.evaluate("window.nnatlasSearch"))
    assert index == search_index.read_search_script((real_site / "search.js").read_text(encoding="utf-8"))
    assert len(index) > 4000 and {e["kind"] for e in index} >= {"checkpoint", "load class", "native class", "value", "note"}
    assert shown() == hit("LlamaAttention") and "llama" in shown()  # llama, and llava's text model
    assert page.locator("#results li").count() >= 1
    assert "native class" in page.locator("#results").inner_text()
    _search(page, "router_logits")  # "which families have router_logits"
    assert shown() == hit("router_logits") and {"qwen3_5_moe_text", "qwen3_next", "mixtral"} <= set(shown())
    href = page.locator("#results a").first.get_attribute("href")
    assert href.split(".html#")[0] in shown()
    _search(page, "Qwen3_5GatedDeltaNet")  # "where is Qwen3_5GatedDeltaNet"
    assert [families.nth(i).get_attribute("data-family") for i in range(families.count())] == ["qwen3_5_text"]
    _search(page, "")
    assert families.count() == total
    page.click("button.trait-filter[data-trait='Rotary positions']")
    import importlib

    import nnatlas

    rotary = sorted(f for f in nnatlas.all_families()
                    if "Rotary positions" in importlib.import_module(f"nnatlas.families.{f}").FAMILY.traits)
    assert {"gemma2", "llama"} <= set(rotary) and "gpt2" not in rotary  # every family with the trait, no other
    assert [families.nth(i).get_attribute("data-family") for i in range(families.count())] == rotary
    page.click("button.trait-filter[data-trait='Rotary positions']")
    assert families.count() == total
    page.click("button.trait-filter[data-trait='LayerNorm']")
    _search(page, "LlamaMLP")
    traits = dict(page.eval_on_selector_all("li.family", "els => els.map(e => [e.dataset.family, e.dataset.traits])"))
    assert shown() == [f for f in hit("LlamaMLP") if "LayerNorm" in traits[f].split("|")]  # both narrow
    assert "llama" not in shown()  # llama's norms are RMSNorms
    assert page.errors == []


def test_keyboard_alone_reaches_every_card(page: Any, test_site: Path, real_site: Path) -> None:
    for path in (real_site / "llama.html", test_site / "hybrid_test.html"):
        _open(page, path)
        section = page.locator("section#block")
        kinds = section.locator(".kind").count()
        slider = section.locator("input.slider")
        blocks = [int(x) for x in slider.get_attribute("data-blocks").split(",")]
        reached: set[str] = set()
        for k in range(kinds):
            slider.focus()
            page.keyboard.press("Home")
            for _ in range(blocks.index(k)):
                page.keyboard.press("ArrowRight")
            want = set(section.locator(f".kind[data-kind='{k}'] button.part").evaluate_all(
                "els => els.map(e => e.dataset.card)")) | set(section.locator(".chain button.part").evaluate_all(
                "els => els.map(e => e.dataset.card)"))
            page.locator("body").focus()
            page.evaluate("document.activeElement && document.activeElement.blur()")
            for _ in range(200):
                page.keyboard.press("Tab")
                info = page.evaluate("""() => { const e = document.activeElement;
                    if (!e || !e.classList.contains('part')) return null;
                    const c = document.getElementById(e.dataset.card);
                    return {card: e.dataset.card, std: e.dataset.std, shown: !c.hidden,
                            text: c.querySelector('.card-std').textContent}; }""")
                if info is None:
                    if want <= reached:
                        break
                    continue
                assert info["shown"], info
                assert info["text"] == info["std"], info
                reached.add(info["card"])
            assert want <= reached, (path.name, k, want - reached)
    assert page.errors == []


def test_spec_strings_stay_text(page: Any, test_site: Path) -> None:
    html = (test_site / "hybrid_test.html").read_text(encoding="utf-8")
    assert len(re.findall(r"<script\b", html)) == 1  # only atlas.js
    index = (test_site / "index.html").read_text(encoding="utf-8")
    assert len(re.findall(r"<script\b", index)) == 1  # atlas.js (the search entries are search.js, loaded on use)
    assert "<" not in (test_site / "search.js").read_text(encoding="utf-8").split("*/", 1)[1]  # escaped as \u003c
    assert "</script><script>window" not in html + index
    guide = (test_site / "guide-nasty-guide.html").read_text(encoding="utf-8")
    assert len(re.findall(r"<script\b", guide)) == 1 and "<img" not in guide and "javascript:" not in guide
    for name in ("hybrid_test.html", "index.html", "guide-nasty-guide.html"):
        _open(page, test_site / name)
        assert page.evaluate("window.__pwned") is None
    _open(page, test_site / "hybrid_test.html")
    summary = page.locator("header .summary").inner_text()
    assert NASTY.split(" {%")[0] in " ".join(summary.split())
    assert "{{ 7 * 7 }}" in summary and "49" not in summary
    assert "</script><script>window.__pwned = 3</script>" in page.locator("header .lines").inner_text()
    assert "<b>tags</b>" in page.locator("#notes").inner_text()
    assert page.title().startswith("family hybrid_test")
    _open(page, test_site / "index.html")
    _search(page, "linear_attn")  # a standard name only the hybrid family has
    shown = page.locator("li.family:not([hidden])")
    assert shown.count() == 1 and shown.first.get_attribute("data-family") == "hybrid_test"
    assert "</script><script>window.__pwned = 3</script>" in shown.first.inner_text()
    assert page.errors == []


def test_the_vision_path_is_drawn_from_the_vision_hosts(page: Any, test_site: Path) -> None:
    _open(page, test_site / "hybrid_test.html")
    vision = page.locator("section#vision")
    assert vision.count() == 1
    chain = vision.locator(".chain button.part").evaluate_all("els => els.map(e => e.querySelector('.part-name').textContent)")
    assert chain[0] == "image" and chain[1].startswith("patch_embed") and chain[2].startswith("layers")
    assert chain[-1].startswith("merger")
    block = vision.locator(".kind:not([hidden]) button.part")
    names = block.evaluate_all("els => els.map(e => e.querySelector('.part-name').textContent)")
    assert names == ["x", "input_layernorm/norm1", "self_attn/attn", "+", "post_attention_layernorm/norm2", "mlp", "+"]
    part = vision.locator(".kind:not([hidden]) button.part.role-mixer")
    part.hover()
    card = page.locator("#" + part.get_attribute("data-card"))
    assert card.is_visible() and card.locator(".card-std").inner_text() == "attention_output"
    assert "VisionAttention" in card.inner_text()
    assert page.errors == []
