// The site's search as a reader meets it: Material for MkDocs' own search worker (from a built site), fed the
// built search index and one query, run in Node. Prints the pages in the order the search box lists them, one
// location a line. Usage: node tests/search_rank.js SITE_DIR QUERY
const fs = require("fs"), path = require("path");
const [site, query] = process.argv.slice(2);
const folder = path.join(site, "assets/javascripts/workers");
const worker = fs.readdirSync(folder).find(f => /^search\..*\.min\.js$/.test(f));
let handler;
const replies = [];
globalThis.self = globalThis;                        // what a worker's global scope provides
globalThis.addEventListener = (_, h) => { handler = h; };
globalThis.postMessage = m => replies.push(m);
globalThis.importScripts = () => {};                 // English only: no language packs to load
require(path.join(folder, worker));
const index = JSON.parse(fs.readFileSync(path.join(site, "search/search_index.json")));
const settle = () => new Promise(resolve => setTimeout(resolve, 100));
(async () => {
  handler({data: {type: 0, data: {config: index.config, docs: index.docs, options: {suggest: false}}}});
  await settle();
  handler({data: {type: 2, data: query}});
  await settle();
  for (const page of replies[replies.length - 1].data.items) console.log(page[0].location.split("#")[0]);
})();
