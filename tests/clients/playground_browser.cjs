// The playground page in a real browser: headless Chromium (Debian's), driven by npm's
// playwright-core, loads GET / from a running `tmx serve`, submits a prompt, and sees the text
// arrive in pieces and the page report tokens/s. Run by tests/apps/serve_cli_test.cpp with
// TMX_BASE_URL, TMX_PLAYWRIGHT_PACKAGE and TMX_CHROMIUM set.
const assert = require('node:assert/strict');
const { chromium } = require(process.env.TMX_PLAYWRIGHT_PACKAGE);

async function main() {
  const browser = await chromium.launch({ executablePath: process.env.TMX_CHROMIUM,
                                          args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(process.env.TMX_BASE_URL + '/');
    assert.equal(await page.title(), 'tmx playground');
    await page.fill('#prompt', 'once upon a time');
    await page.fill('#temperature', '0.7');
    await page.fill('#max_tokens', '400');
    // Count the updates of the output as the stream arrives.
    await page.evaluate(() => {
      window.updates = 0;
      new MutationObserver(() => { window.updates += 1; })
        .observe(document.getElementById('out'), { childList: true, subtree: true, characterData: true });
    });
    await page.click('#go');
    await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('done'),
                               null, { timeout: 60000 });
    const status = await page.textContent('#status');
    const text = await page.textContent('#generated');
    const updates = await page.evaluate(() => window.updates);
    const tokens = Number((status.match(/(\d+) tokens in/) || [])[1]);
    assert.match(status, /^done \((stop|length)\): first text after [\d.]+ s, \d+ tokens in [\d.]+ s, [\d.]+ tokens\/s$/);
    assert.ok(tokens >= 1 && tokens <= 400, status);
    // The prompt's span is one update, the streamed text at least one more. (How many depends on
    // how the network groups the events: this tiny model can finish before the first read.)
    assert.ok(updates >= 2 || tokens < 8, `the text never appeared (${updates} updates)`);
    assert.ok(text.length > 0 || tokens < 8, 'no text arrived');
    assert.deepEqual(errors, []);
    console.log(`playground: ok (${status}; ${updates} updates)`);
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
